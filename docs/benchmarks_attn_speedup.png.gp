set terminal pngcairo size 1000,650 noenhanced
set output 'docs/benchmarks_attn_speedup.png'
set title 'decode attention op, B=1, 32 heads, 8 KV heads, d=128, f16, 2 threads'
set logscale x 2
set logscale y 2
set grid
set key outside right top
set xlabel 'context length S (positions)'
set ylabel 'speed-up over dense (solid: measured, dashed: theoretical)'
$s0 << EOD
1024 1.90209 5.28351
2048 2.41994 7.94186
4096 5.12072 10.614
8192 7.04562 12.7617
16384 11.6194 14.1984
32768 15.0698 15.0455
65536 11.1497 15.508
131072 9.7175 15.7502
262144 6.46086 15.8741
524288 7.46587 15.9368
1048576 6.02476 15.9683
EOD
$s1 << EOD
1024 1.60237 3.97287
2048 2.18262 5.30829
4096 3.94449 6.38162
8192 4.79306 7.09965
16384 7.27985 7.52296
32768 7.80026 7.75414
65536 5.3384 7.87515
131072 5.0254 7.93708
262144 4.28806 7.96842
524288 2.67415 7.98418
1048576 4.07624 7.99208
EOD
plot 1 with lines lc rgb 'black' dt 3 title 'dense (1x)', \
  $s0 using 1:2 with linespoints lw 2 pt 7 lc 1 title 'sparq r=16 k=128', \
  $s0 using 1:3 with linespoints dt 2 pt 6 lc 1 title 'sparq r=16 k=128, theoretical', \
  $s1 using 1:2 with linespoints lw 2 pt 7 lc 2 title 'sparq r=32 k=128', \
  $s1 using 1:3 with linespoints dt 2 pt 6 lc 2 title 'sparq r=32 k=128, theoretical'
