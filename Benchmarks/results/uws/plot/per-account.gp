set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'per-account.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$s0l << EOD
10000.0 0.6719999999999999
25000.0 4.424
50000.0 15.2045
100000.0 574.62
150000.0 847.2494999999999
200000.0 964.69
EOD
$s1l << EOD
10000.0 0.7375
25000.0 1.6875
50000.0 66.8465
100000.0 180.35500000000002
150000.0 180.35500000000002
200000.0 190.841
EOD
$s2l << EOD
10000.0 2.818
25000.0 91.226
50000.0 381.682
100000.0 599.577
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
10000.0 9967.0
25000.0 24921.5
50000.0 49798.5
100000.0 82961.0
150000.0 87713.5
200000.0 79962.0
EOD
$s1r << EOD
10000.0 9968.5
25000.0 24922.5
50000.0 48623.5
100000.0 86664.0
150000.0 99449.5
200000.0 99548.0
EOD
$s2r << EOD
10000.0 9964.5
25000.0 24833.5
50000.0 35334.0
100000.0 32710.5
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
