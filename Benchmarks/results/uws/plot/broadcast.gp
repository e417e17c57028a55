set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'broadcast.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$lat << EOD
server p50 p90 p99 p99.9 max
hub 136.3145 207.618 289.40700000000004 369.099 449.8595
uws 169.869 216.0065 249.561 278.921 287.293
socketify 174.0635 222.2985 310.37850000000003 356.51599999999996 385.793
EOD
set title "publish-to-receive latency, all deliveries"
set ylabel 'ms (log scale)'
set logscale y
set yrange [*:*]
set format y '%g'
set style data histograms
set style histogram clustered gap 1
set boxwidth 0.9
set xtics rotate by -25
plot for [i=2:6] $lat using i:xtic(1) title columnheader(i)
unset logscale y
$d76094 << EOD
"hub" 0.99
"uws" 1.1099999999999999
"socketify" 1.155
EOD
set title "server CPU per delivery"
set ylabel 'µs'
set style data histograms
set style histogram clustered
set boxwidth 0.7
set xtics nomirror rotate by -25
set format y '%g'
unset logscale y
set yrange [0:*]
plot $d76094 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
