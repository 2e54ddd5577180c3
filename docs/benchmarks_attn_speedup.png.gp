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
1024 2.04046 5.28351
2048 2.56434 7.94186
4096 6.76393 10.614
8192 9.31521 12.7617
16384 11.1083 14.1984
32768 12.621 15.0455
65536 13.8108 15.508
131072 4.23076 15.7502
262144 11.8898 15.8741
524288 11.3637 15.9368
1048576 9.06466 15.9683
EOD
$s1 << EOD
1024 2.0694 3.97287
2048 2.18226 5.30829
4096 5.21442 6.38162
8192 6.3251 7.09965
16384 9.10128 7.52296
32768 8.37357 7.75414
65536 9.45421 7.87515
131072 6.19739 7.93708
262144 7.34056 7.96842
524288 7.77558 7.98418
1048576 5.57684 7.99208
EOD
plot 1 with lines lc rgb 'black' dt 3 title 'dense (1x)', \
  $s0 using 1:2 with linespoints lw 2 pt 7 lc 1 title 'sparq r=16 k=128', \
  $s0 using 1:3 with lines dt 2 lc 1 notitle, \
  $s1 using 1:2 with linespoints lw 2 pt 7 lc 2 title 'sparq r=32 k=128', \
  $s1 using 1:3 with lines dt 2 lc 2 notitle
