set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'per-account.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$s0l << EOD
10000.0 0.512
25000.0 1.884
50000.0 6.554
100000.0 62.39
150000.0 662.7
200000.0 696.2545
EOD
$s1l << EOD
10000.0 0.6145
25000.0 1.0405
50000.0 2.5885
100000.0 112.19749999999999
150000.0 142.60649999999998
200000.0 140.50900000000001
EOD
$s2l << EOD
10000.0 1.0485
25000.0 3.932
50000.0 213.9095
100000.0 364.9045
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
10000.0 9974.0
25000.0 24932.5
50000.0 49849.0
100000.0 99582.0
150000.0 104488.5
200000.0 101768.5
EOD
$s1r << EOD
10000.0 9984.0
25000.0 24935.0
50000.0 49789.0
100000.0 96483.5
150000.0 110746.5
200000.0 110172.5
EOD
$s2r << EOD
10000.0 9975.5
25000.0 24951.5
50000.0 38966.5
100000.0 40408.5
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
