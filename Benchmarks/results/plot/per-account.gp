set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'per-account.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$s0l << EOD
10000.0 0.401
25000.0 1.212
50000.0 3.146
100000.0 419.43
150000.0 855.638
200000.0 889.192
EOD
$s1l << EOD
10000.0 1.18
25000.0 11.01
50000.0 14.68
100000.0 15.729
EOD
$s2l << EOD
10000.0 2.687
25000.0 197.132
50000.0 570.425
100000.0 520.094
EOD
$s3l << EOD
10000.0 6.816
25000.0 163.578
50000.0 360.71
100000.0 293.601
EOD
set title "p99 latency vs offered rate"
set xlabel 'offered events/s'
set ylabel 'p99 ms (log scale)'
set style data linespoints
set logscale x
set format x '%.0s%c'
set format y '%g'
set logscale y
set yrange [*:*]
plot $s0l using 1:2 with linespoints lw 2 title 'hub', $s1l using 1:2 with linespoints lw 2 title 'nchan', $s2l using 1:2 with linespoints lw 2 title 'hummingbird', $s3l using 1:2 with linespoints lw 2 title 'python', 10 with lines dt 2 lc rgb 'gray' title '10 ms'
$s0r << EOD
10000.0 9981.0
25000.0 24880.0
50000.0 49813.0
100000.0 86529.0
150000.0 76743.0
200000.0 125205.0
EOD
$s1r << EOD
10000.0 9959.0
25000.0 24857.0
50000.0 26073.0
100000.0 23270.0
EOD
$s2r << EOD
10000.0 9963.0
25000.0 23888.0
50000.0 27839.0
100000.0 28652.0
EOD
$s3r << EOD
10000.0 9954.0
25000.0 24448.0
50000.0 28741.0
100000.0 33282.0
EOD
set title "events published/s vs offered"
set xlabel 'offered events/s'
set ylabel 'events/s'
set style data linespoints
set logscale x
set format x '%.0s%c'
set format y '%.0s%c'
unset logscale y
set yrange [0:*]
plot $s0r using 1:2 with linespoints lw 2 title 'hub', $s1r using 1:2 with linespoints lw 2 title 'nchan', $s2r using 1:2 with linespoints lw 2 title 'hummingbird', $s3r using 1:2 with linespoints lw 2 title 'python'
unset multiplot
