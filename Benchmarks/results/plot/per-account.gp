set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'per-account.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$s0l << EOD
10000.0 0.393
25000.0 0.705
50000.0 1.376
100000.0 45.089
150000.0 637.534
200000.0 603.98
EOD
$s1l << EOD
10000.0 1.049
25000.0 8.913
50000.0 11.534
100000.0 11.534
EOD
$s2l << EOD
10000.0 0.999
25000.0 2.359
50000.0 167.772
100000.0 335.544
150000.0 327.156
EOD
$s3l << EOD
10000.0 0.901
25000.0 14.418
50000.0 276.824
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
10000.0 9977.0
25000.0 24947.0
50000.0 49841.0
100000.0 98173.0
150000.0 112807.0
200000.0 130015.0
EOD
$s1r << EOD
10000.0 9975.0
25000.0 24890.0
50000.0 35525.0
100000.0 33530.0
EOD
$s2r << EOD
10000.0 9982.0
25000.0 24928.0
50000.0 48150.0
100000.0 54531.0
150000.0 49860.0
EOD
$s3r << EOD
10000.0 9977.0
25000.0 25041.0
50000.0 29877.0
100000.0 29277.0
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
