set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'per-account.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$s0l << EOD
10000.0 0.5489999999999999
25000.0 2.048
50000.0 6.423
100000.0 51.9045
150000.0 670.954
200000.0 679.4770000000001
EOD
$s1l << EOD
10000.0 0.6305
25000.0 1.196
50000.0 6.209499999999999
100000.0 97.51750000000001
150000.0 155.18900000000002
200000.0 169.8695
EOD
$s2l << EOD
10000.0 1.884
25000.0 10.486
50000.0 304.0875
100000.0 436.2075
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
10000.0 9980.5
25000.0 24958.0
50000.0 49876.0
100000.0 99336.0
150000.0 105475.5
200000.0 105658.5
EOD
$s1r << EOD
10000.0 9974.5
25000.0 24920.5
50000.0 49945.5
100000.0 94003.0
150000.0 108432.0
200000.0 102336.0
EOD
$s2r << EOD
10000.0 9975.5
25000.0 24945.5
50000.0 36923.0
100000.0 39908.5
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
