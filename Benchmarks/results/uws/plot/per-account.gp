set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'per-account.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$s0l << EOD
10000.0 1.483
25000.0 6.1605
50000.0 30.671
100000.0 654.3115
150000.0 805.306
200000.0 1038.839
EOD
$s1l << EOD
10000.0 0.7535
25000.0 10.207
50000.0 35.1275
100000.0 159.3835
150000.0 150.995
200000.0 226.492
EOD
$s2l << EOD
10000.0 2.4415
25000.0 112.19800000000001
50000.0 293.6015
100000.0 461.37350000000004
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
10000.0 9967.5
25000.0 24899.5
50000.0 49814.5
100000.0 78730.5
150000.0 90404.0
200000.0 82044.0
EOD
$s1r << EOD
10000.0 9963.5
25000.0 24899.0
50000.0 49663.0
100000.0 93017.5
150000.0 111274.5
200000.0 91113.5
EOD
$s2r << EOD
10000.0 9971.5
25000.0 24334.0
50000.0 36014.0
100000.0 36770.5
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
