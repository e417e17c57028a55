set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output 'slow.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$w013 << EOD
1.0 28.7
2.0 28.8
3.0 28.8
4.0 28.8
5.0 28.9
6.0 28.9
7.0 29.1
8.0 29.7
9.1 30.1
10.1 30.2
11.1 30.2
12.1 30.2
13.1 30.2
14.1 30.2
15.1 30.2
16.1 30.2
17.1 30.2
18.1 30.2
19.1 30.2
20.1 30.2
EOD
$w113 << EOD
1.0 56.0
2.0 57.7
3.0 59.6
4.0 61.3
5.0 62.9
6.0 64.6
7.1 68.7
8.1 77.0
9.1 84.7
10.1 90.8
11.1 96.5
12.1 101.5
13.1 107.8
14.1 114.2
15.1 118.3
16.1 122.9
17.1 126.5
18.1 130.0
19.1 133.6
20.1 137.0
EOD
$w213 << EOD
1.0 69.4
2.0 69.4
3.0 69.4
4.0 69.4
5.1 70.5
6.1 70.5
7.1 70.6
8.1 71.6
9.1 72.7
10.1 74.5
11.1 75.0
12.1 76.2
13.1 77.1
14.1 79.6
15.1 80.4
16.1 80.9
17.1 81.3
18.1 82.8
19.1 83.7
20.1 84.6
EOD
$w313 << EOD
1.0 51.0
2.0 51.0
3.0 51.0
4.0 51.0
5.0 51.0
6.0 51.0
7.0 68.4
8.1 112.6
9.1 156.1
10.1 197.8
11.1 238.3
12.1 279.3
13.1 320.9
14.1 360.3
15.1 403.4
16.1 443.8
17.1 482.6
18.1 518.5
19.1 559.7
20.2 597.0
EOD
set title "server RSS while 10 % of subscribers do not read"
set xlabel 'seconds'
set ylabel 'MiB'
set format y '%g'
unset logscale y
set yrange [0:*]
plot $w013 using 1:2 with linespoints lw 2 title 'hub', $w113 using 1:2 with linespoints lw 2 title 'nchan', $w213 using 1:2 with linespoints lw 2 title 'hummingbird', $w313 using 1:2 with linespoints lw 2 title 'python'
$w06 << EOD
1.0 6.16
2.0 5.898
3.0 7.34
4.0 7.34
5.0 7.471
6.0 7.733
7.0 7.34
8.0 4.85
9.1 5.505
10.1 5.636
11.1 5.243
12.1 46.137
13.1 5.112
14.1 4.981
15.1 6.029
16.1 5.898
17.1 5.636
18.1 6.16
19.1 5.374
20.1 5.767
EOD
$w16 << EOD
1.0 11.534
2.0 14.418
3.0 27.263
4.0 17.826
5.0 19.923
6.0 29.36
7.1 30.409
8.1 27.787
9.1 79.692
10.1 301.99
11.1 637.534
12.1 1342.177
13.1 1740.207
14.1 1742.304
15.1 2307.357
16.1 2818.572
17.1 3375.184
18.1 3818.961
19.1 4188.116
20.1 4574.631
EOD
$w26 << EOD
1.0 100.663
2.0 37.749
3.0 88.08
4.0 146.801
5.1 394.265
6.1 394.265
7.1 71.303
8.1 117.441
9.1 45.089
10.1 427.819
11.1 12.583
12.1 10.748
13.1 15.729
14.1 47.186
15.1 15.991
16.1 33.03
17.1 20.972
18.1 46.137
19.1 25.166
20.1 16.777
EOD
$w36 << EOD
1.0 10.748
2.0 11.796
3.0 11.01
4.0 10.748
5.0 10.486
6.0 11.534
7.0 8.651
8.1 11.272
9.1 8.913
10.1 9.437
11.1 21.496
12.1 39.846
13.1 18.874
14.1 16.777
15.1 10.224
16.1 77.595
17.1 98.566
18.1 109.052
19.1 155.189
20.2 176.161
EOD
set title "reading subscribers' p99 per second"
set xlabel 'seconds'
set ylabel 'ms (log scale)'
set format y '%g'
set logscale y
set yrange [*:*]
plot $w06 using 1:2 with linespoints lw 2 title 'hub', $w16 using 1:2 with linespoints lw 2 title 'nchan', $w26 using 1:2 with linespoints lw 2 title 'hummingbird', $w36 using 1:2 with linespoints lw 2 title 'python'
unset multiplot
