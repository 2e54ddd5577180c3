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
1024 0.540096 5.28351
4096 0.641184 10.614
16384 1.67143 14.1984
32768 2.28679 15.0455
131072 5.73367 15.7502
EOD
$s1 << EOD
1024 0.631874 3.97287
4096 0.998654 6.38162
16384 1.43005 7.52296
32768 1.99937 7.75414
131072 5.09068 7.93708
EOD
plot 1 with lines lc rgb 'black' dt 3 title 'dense (1x)', \
  $s0 using 1:2 with linespoints lw 2 pt 7 lc 1 title 'sparq r=16 k=128', \
  $s0 using 1:3 with lines dt 2 lc 1 notitle, \
  $s1 using 1:2 with linespoints lw 2 pt 7 lc 2 title 'sparq r=32 k=128', \
  $s1 using 1:3 with lines dt 2 lc 2 notitle
