set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'per-account.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$s0l << EOD
10000.0 4.096
25000.0 6.4879999999999995
50000.0 21.889
100000.0 973.0785
150000.0 1056.965
EOD
$s1l << EOD
10000.0 5.218
25000.0 3.4074999999999998
50000.0 36.962
100000.0 197.132
150000.0 241.1725
200000.0 176.161
EOD
$s2l << EOD
10000.0 8.2575
25000.0 77.4635
50000.0 570.4255
100000.0 671.089
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
plot $s0l using 1:2 with linespoints lw 2 title 'hub', $s1l using 1:2 with linespoints lw 2 title 'uws', $s2l using 1:2 with linespoints lw 2 title 'socketify', 10 with lines dt 2 lc rgb 'gray' title '10 ms'
$s0r << EOD
10000.0 9968.0
25000.0 24886.5
50000.0 49668.0
100000.0 66843.5
150000.0 91739.0
EOD
$s1r << EOD
10000.0 9965.5
25000.0 24911.5
50000.0 49777.5
100000.0 68079.5
150000.0 78662.0
200000.0 92977.0
EOD
$s2r << EOD
10000.0 9946.5
25000.0 23066.5
50000.0 28872.0
100000.0 31173.0
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
plot $s0r using 1:2 with linespoints lw 2 title 'hub', $s1r using 1:2 with linespoints lw 2 title 'uws', $s2r using 1:2 with linespoints lw 2 title 'socketify'
unset multiplot
