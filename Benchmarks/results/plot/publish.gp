set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'publish.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$d23514 << EOD
"hub" 170385.5
"socketify" 77363.0
"nchan" 27553.5
"hummingbird" 72757.5
"python" 45965.5
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
plot $d23514 using 2:xtic(1) notitle lc rgb '#4477aa'
$d82968 << EOD
"hub" 6.779999999999999
"socketify" 12.85
"nchan" 37.685
"hummingbird" 20.22
"python" 22.025
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
plot $d82968 using 2:xtic(1) notitle lc rgb '#4477aa'
unset multiplot
