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
1024 1.74206 5.28351
2048 2.31048 7.94186
4096 5.77351 10.614
8192 6.89899 12.7617
16384 7.34067 14.1984
32768 9.6908 15.0455
65536 10.949 15.508
131072 13.2748 15.7502
262144 8.90554 15.8741
524288 9.2367 15.9368
1048576 6.52655 15.9683
EOD
$s1 << EOD
1024 1.62635 3.97287
2048 1.94191 5.30829
4096 4.64255 6.38162
8192 5.73294 7.09965
16384 7.10969 7.52296
32768 6.99191 7.75414
65536 6.93838 7.87515
131072 7.72347 7.93708
262144 6.98799 7.96842
524288 5.84991 7.98418
1048576 6.41261 7.99208
EOD
plot 1 with lines lc rgb 'black' dt 3 title 'dense (1x)', \
  $s0 using 1:2 with linespoints lw 2 pt 7 lc 1 title 'sparq r=16 k=128', \
  $s0 using 1:3 with lines dt 2 lc 1 notitle, \
  $s1 using 1:2 with linespoints lw 2 pt 7 lc 2 title 'sparq r=32 k=128', \
  $s1 using 1:3 with lines dt 2 lc 2 notitle
