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
1024 0.977248 5.28351
2048 0.999372 7.94186
4096 1.01944 10.614
8192 0.98282 12.7617
16384 1.33843 14.1984
32768 2.00044 15.0455
65536 3.00671 15.508
131072 4.20817 15.7502
262144 9.29646 15.8741
524288 11.3198 15.9368
1048576 11.4935 15.9683
EOD
$s1 << EOD
1024 0.0264371 3.97287
2048 1.00104 5.30829
4096 1.01837 6.38162
8192 0.998625 7.09965
16384 1.33496 7.52296
32768 2.002 7.75414
65536 2.25667 7.87515
131072 4.0087 7.93708
262144 7.07059 7.96842
524288 6.76344 7.98418
1048576 4.86077 7.99208
EOD
plot 1 with lines lc rgb 'black' dt 3 title 'dense (1x)', \
  $s0 using 1:2 with linespoints lw 2 pt 7 lc 1 title 'sparq r=16 k=128', \
  $s0 using 1:3 with lines dt 2 lc 1 notitle, \
  $s1 using 1:2 with linespoints lw 2 pt 7 lc 2 title 'sparq r=32 k=128', \
  $s1 using 1:3 with lines dt 2 lc 2 notitle
