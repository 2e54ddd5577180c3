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
1024 1.55406 5.28351
2048 2.01257 7.94186
4096 4.21732 10.614
8192 9.40924 12.7617
16384 10.248 14.1984
32768 13.2546 15.0455
65536 12.6157 15.508
131072 16.3465 15.7502
262144 15.3314 15.8741
524288 15.0246 15.9368
1048576 8.67731 15.9683
EOD
$s1 << EOD
1024 1.26118 3.97287
2048 1.78153 5.30829
4096 2.87641 6.38162
8192 9.84108 7.09965
16384 10.6114 7.52296
32768 9.93115 7.75414
65536 8.80369 7.87515
131072 12.0555 7.93708
262144 9.59106 7.96842
524288 10.8393 7.98418
1048576 6.98585 7.99208
EOD
plot 1 with lines lc rgb 'black' dt 3 title 'dense (1x)', \
  $s0 using 1:2 with linespoints lw 2 pt 7 lc 1 title 'sparq r=16 k=128', \
  $s0 using 1:3 with linespoints dt 2 pt 6 lc 1 title 'sparq r=16 k=128, theoretical', \
  $s1 using 1:2 with linespoints lw 2 pt 7 lc 2 title 'sparq r=32 k=128', \
  $s1 using 1:3 with linespoints dt 2 pt 6 lc 2 title 'sparq r=32 k=128, theoretical'
