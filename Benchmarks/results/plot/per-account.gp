set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'per-account.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$s0l << EOD
10000.0 0.9259999999999999
25000.0 3.9975
50000.0 10.617
100000.0 678.1579999999999
150000.0 1005.1935
EOD
$s1l << EOD
10000.0 4.063
25000.0 15.3355
50000.0 377.4875
100000.0 457.1795
EOD
$s2l << EOD
10000.0 5.439500000000001
25000.0 22.8065
50000.0 19.661
100000.0 22.02
EOD
$s3l << EOD
10000.0 4.0634999999999994
25000.0 28.967000000000002
50000.0 448.7905
100000.0 499.12199999999996
EOD
$s4l << EOD
10000.0 1.8675000000000002
25000.0 137.3635
50000.0 364.9045
100000.0 318.767
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
10000.0 9977.0
25000.0 24934.5
50000.0 49844.5
100000.0 79268.5
150000.0 72121.5
EOD
$s1r << EOD
10000.0 9966.5
25000.0 24859.0
50000.0 34046.0
100000.0 36851.5
EOD
$s2r << EOD
10000.0 9964.0
25000.0 20095.0
50000.0 21948.5
100000.0 23329.0
EOD
$s3r << EOD
10000.0 9963.0
25000.0 24877.5
50000.0 38848.0
100000.0 41136.5
EOD
$s4r << EOD
10000.0 9971.0
25000.0 23785.0
50000.0 26236.0
100000.0 31253.0
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
