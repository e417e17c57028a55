set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'per-account.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$s0l << EOD
10000.0 0.8355
25000.0 4.8495
50000.0 42.7295
100000.0 830.4725000000001
150000.0 964.69
200000.0 922.747
EOD
$s1l << EOD
10000.0 1.6059999999999999
25000.0 2.425
50000.0 31.7195
100000.0 178.25799999999998
150000.0 222.298
200000.0 245.36700000000002
EOD
$s2l << EOD
10000.0 2.6870000000000003
25000.0 103.809
50000.0 566.238
100000.0 570.425
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
10000.0 9972.5
25000.0 24890.5
50000.0 49440.0
100000.0 73377.5
150000.0 77251.0
200000.0 78348.0
EOD
$s1r << EOD
10000.0 9968.5
25000.0 24898.5
50000.0 49822.0
100000.0 82180.5
150000.0 85618.5
200000.0 85528.5
EOD
$s2r << EOD
10000.0 9969.0
25000.0 24296.0
50000.0 29339.5
100000.0 31549.5
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
