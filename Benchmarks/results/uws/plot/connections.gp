set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'connections.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,3
$d39017 << EOD
"hub" 4673.5
"uws" 4673.5
"socketify" 4665.0
EOD
set title "handshakes/s during the ramp"
set ylabel 'per second'
set style data histograms
set style histogram clustered
set boxwidth 0.7
set xtics nomirror rotate by -25
set format y '%g'
unset logscale y
set yrange [0:*]
plot $d39017 using 2:xtic(1) notitle lc rgb '#4477aa'
$d41902 << EOD
"hub" 0.83935546875
"uws" 1.091796875
"socketify" 1.27392578125
EOD
set title "RSS per connection"
set ylabel 'KiB'
set style data histograms
set style histogram clustered
set boxwidth 0.7
set xtics nomirror rotate by -25
set format y '%g'
unset logscale y
set yrange [0:*]
plot $d41902 using 2:xtic(1) notitle lc rgb '#4477aa'
$d6043 << EOD
"hub" 83.15
"uws" 61.35
"socketify" 200.55
EOD
set title "server CPU per handshake"
set ylabel 'µs'
set style data histograms
set style histogram clustered
set boxwidth 0.7
set xtics nomirror rotate by -25
set format y '%g'
unset logscale y
set yrange [0:*]
plot $d6043 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
