set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'publish.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$d86489 << EOD
"hub" 176975.5
"socketify" 71095.5
"nchan" 29735.5
"hummingbird" 72895.0
"python" 41553.0
EOD
set title "publishes/s accepted and replied"
set ylabel 'per second'
set style data histograms
set style histogram clustered
set boxwidth 0.7
set xtics nomirror rotate by -25
set format y '%g'
unset logscale y
set yrange [0:*]
plot $d86489 using 2:xtic(1) notitle lc rgb '#4477aa'
$d57267 << EOD
"hub" 6.275
"socketify" 14.105
"nchan" 33.675
"hummingbird" 19.87
"python" 24.02
EOD
set title "server CPU per publish"
set ylabel 'µs'
set style data histograms
set style histogram clustered
set boxwidth 0.7
set xtics nomirror rotate by -25
set format y '%g'
unset logscale y
set yrange [0:*]
plot $d57267 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
