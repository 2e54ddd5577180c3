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
1024 1.73154 5.28351
2048 2.25048 7.94186
4096 4.26795 10.614
8192 7.03252 12.7617
16384 8.7242 14.1984
32768 7.0156 15.0455
65536 11.8648 15.508
131072 10.3968 15.7502
262144 9.24566 15.8741
524288 7.42325 15.9368
1048576 4.24567 15.9683
EOD
$s1 << EOD
1024 1.55924 3.97287
2048 1.94309 5.30829
4096 3.20952 6.38162
8192 4.79689 7.09965
16384 5.37759 7.52296
32768 6.25787 7.75414
65536 6.67207 7.87515
131072 6.03386 7.93708
262144 5.48687 7.96842
524288 4.63887 7.98418
1048576 3.84844 7.99208
EOD
plot 1 with lines lc rgb 'black' dt 3 title 'dense (1x)', \
  $s0 using 1:2 with linespoints lw 2 pt 7 lc 1 title 'sparq r=16 k=128', \
  $s0 using 1:3 with linespoints dt 2 pt 6 lc 1 title 'sparq r=16 k=128, theoretical', \
  $s1 using 1:2 with linespoints lw 2 pt 7 lc 2 title 'sparq r=32 k=128', \
  $s1 using 1:3 with linespoints dt 2 pt 6 lc 2 title 'sparq r=32 k=128, theoretical'
