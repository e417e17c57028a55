set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'per-account.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$s0l << EOD
10000.0 0.721
25000.0 4.063000000000001
50000.0 7.7989999999999995
100000.0 413.13899999999995
150000.0 805.3065
200000.0 805.3064999999999
EOD
$s1l << EOD
10000.0 5.243
25000.0 10.748000000000001
50000.0 234.881
100000.0 419.43
EOD
$s2l << EOD
10000.0 4.3580000000000005
25000.0 24.3795
50000.0 24.3795
EOD
$s3l << EOD
10000.0 3.719
25000.0 6.5535
50000.0 499.12199999999996
100000.0 578.8140000000001
EOD
$s4l << EOD
10000.0 2.7855
25000.0 102.76050000000001
50000.0 352.3215
100000.0 268.435
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
plot $s0l using 1:2 with linespoints lw 2 title 'hub', $s1l using 1:2 with linespoints lw 2 title 'socketify', $s2l using 1:2 with linespoints lw 2 title 'nchan', $s3l using 1:2 with linespoints lw 2 title 'hummingbird', $s4l using 1:2 with linespoints lw 2 title 'python', 10 with lines dt 2 lc rgb 'gray' title '10 ms'
$s0r << EOD
10000.0 9980.5
25000.0 24932.5
50000.0 49847.0
100000.0 88817.0
150000.0 86924.0
200000.0 92453.0
EOD
$s1r << EOD
10000.0 9970.5
25000.0 24945.0
50000.0 40343.0
100000.0 42779.0
EOD
$s2r << EOD
10000.0 9963.0
25000.0 17451.5
50000.0 16951.0
EOD
$s3r << EOD
10000.0 9973.0
25000.0 24931.5
50000.0 38558.0
100000.0 41112.0
EOD
$s4r << EOD
10000.0 9973.0
25000.0 23996.5
50000.0 26482.5
100000.0 31262.0
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
plot $s0r using 1:2 with linespoints lw 2 title 'hub', $s1r using 1:2 with linespoints lw 2 title 'socketify', $s2r using 1:2 with linespoints lw 2 title 'nchan', $s3r using 1:2 with linespoints lw 2 title 'hummingbird', $s4r using 1:2 with linespoints lw 2 title 'python'
unset multiplot
