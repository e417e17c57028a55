set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'per-account.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$s0l << EOD
10000.0 1.9335
25000.0 7.078
50000.0 37.2245
100000.0 1143.3345
EOD
$s1l << EOD
10000.0 3.8665000000000003
25000.0 13.107
50000.0 47.186
100000.0 220.201
150000.0 245.36700000000002
200000.0 247.464
EOD
$s2l << EOD
10000.0 5.571
25000.0 176.161
50000.0 503.3165
100000.0 553.648
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
10000.0 9960.5
25000.0 24861.0
50000.0 49596.5
100000.0 57697.0
EOD
$s1r << EOD
10000.0 9963.0
25000.0 24875.5
50000.0 49898.0
100000.0 65769.5
150000.0 75422.5
200000.0 82354.0
EOD
$s2r << EOD
10000.0 9954.0
25000.0 21925.0
50000.0 30709.0
100000.0 31427.0
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
