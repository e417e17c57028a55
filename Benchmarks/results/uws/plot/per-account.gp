set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'per-account.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$s0l << EOD
10000.0 0.6225
25000.0 3.0145
50000.0 8.061
100000.0 162.529
150000.0 679.477
200000.0 720.9705
EOD
$s1l << EOD
10000.0 0.5894999999999999
25000.0 1.065
50000.0 7.569500000000001
100000.0 120.586
150000.0 148.898
200000.0 153.09199999999998
EOD
$s2l << EOD
10000.0 1.376
25000.0 3.703
50000.0 281.018
100000.0 377.487
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
10000.0 9978.0
25000.0 24935.5
50000.0 49845.5
100000.0 95518.5
150000.0 105019.0
200000.0 104856.0
EOD
$s1r << EOD
10000.0 9979.0
25000.0 24946.0
50000.0 49718.0
100000.0 95705.0
150000.0 108541.5
200000.0 109279.5
EOD
$s2r << EOD
10000.0 9970.0
25000.0 24950.0
50000.0 37728.0
100000.0 40228.0
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
