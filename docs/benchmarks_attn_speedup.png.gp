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
1024 2.1328 5.28351
2048 3.02176 7.94186
4096 5.00987 10.614
8192 7.1382 12.7617
16384 8.7871 14.1984
32768 10.21 15.0455
65536 14.8756 15.508
131072 10.9771 15.7502
262144 5.28047 15.8741
524288 10.8739 15.9368
1048576 9.11011 15.9683
EOD
$s1 << EOD
1024 1.8702 3.97287
2048 2.45576 5.30829
4096 3.85615 6.38162
8192 5.3213 7.09965
16384 6.75733 7.52296
32768 7.25228 7.75414
65536 8.86285 7.87515
131072 5.93243 7.93708
262144 6.81572 7.96842
524288 7.572 7.98418
1048576 5.79473 7.99208
EOD
plot 1 with lines lc rgb 'black' dt 3 title 'dense (1x)', \
  $s0 using 1:2 with linespoints lw 2 pt 7 lc 1 title 'sparq r=16 k=128', \
  $s0 using 1:3 with lines dt 2 lc 1 notitle, \
  $s1 using 1:2 with linespoints lw 2 pt 7 lc 2 title 'sparq r=32 k=128', \
  $s1 using 1:3 with lines dt 2 lc 2 notitle
