set terminal pngcairo size 1100,560 font 'DejaVu Sans,10'
set output '/work/wt/loadgen/Benchmarks/results/slow.png'
set grid ytics
set key below
set style fill solid 0.8 border -1
set format y '%g'
set multiplot layout 1,2
$w013 << EOD
1.0 29.4
2.0 29.4
3.0 29.4
4.1 29.4
5.1 29.5
6.1 29.5
7.1 29.7
8.1 30.3
9.2 30.7
10.2 30.7
11.2 30.7
12.2 30.8
13.2 30.8
14.2 30.8
15.2 30.8
16.2 30.8
17.2 30.8
18.2 30.8
19.3 30.8
20.3 30.8
EOD
$w113 << EOD
1.0 54.6
2.0 56.4
3.0 57.6
4.0 58.8
5.0 61.3
6.0 92.6
7.0 117.9
8.1 138.8
9.1 159.2
10.1 190.0
11.1 224.5
12.1 234.3
13.1 238.9
14.1 240.6
15.1 250.0
16.1 265.9
17.1 282.0
18.1 298.1
19.1 308.6
20.1 314.1
EOD
$w213 << EOD
1.0 70.4
2.0 70.9
3.0 71.0
4.0 71.0
5.1 71.2
6.1 71.4
7.1 71.4
8.1 71.8
9.1 71.9
10.1 72.5
11.1 76.4
12.2 79.1
13.2 79.3
14.2 80.6
15.2 84.5
16.2 85.3
17.2 85.8
18.2 86.0
19.2 86.3
20.2 86.4
EOD
$w313 << EOD
1.0 51.3
2.0 51.7
3.0 52.0
4.0 52.3
5.0 52.7
6.0 53.0
7.0 53.3
8.0 53.5
9.0 53.8
10.0 82.6
11.1 122.0
12.1 164.0
13.1 193.0
14.1 229.5
15.1 271.9
16.1 310.2
17.1 339.9
18.1 367.9
19.1 390.8
20.1 416.8
EOD
set title "server RSS while 10 % of subscribers do not read"
set xlabel 'seconds'
set ylabel 'MiB'
set format y '%g'
unset logscale y
set yrange [0:*]
plot $w013 using 1:2 with linespoints lw 2 title 'hub', $w113 using 1:2 with linespoints lw 2 title 'nchan', $w213 using 1:2 with linespoints lw 2 title 'hummingbird', $w313 using 1:2 with linespoints lw 2 title 'python'
$w06 << EOD
1.0 20.972
2.0 17.302
3.0 20.972
4.1 29.884
5.1 34.603
6.1 35.652
7.1 38.797
8.1 12.845
9.2 12.321
10.2 12.583
11.2 12.059
12.2 113.246
13.2 6.291
14.2 10.486
15.2 10.224
16.2 12.059
17.2 7.078
18.2 5.767
19.3 12.059
20.3 13.631
EOD
$w16 << EOD
1.0 411.042
2.0 802.9
3.0 1404.714
4.0 1669.443
5.0 1682.491
6.0 1778.385
7.0 293.601
8.1 754.975
9.1 1440.076
10.1 1897.639
11.1 1966.061
12.1 7877.522
13.1 2684.355
14.1 3380.901
15.1 3667.263
16.1 3382.57
17.1 3376.24
18.1 3288.334
19.1 3422.552
20.1 3607.78
EOD
$w26 << EOD
1.0 352.322
2.0 553.648
3.0 939.524
4.0 503.316
5.1 452.985
6.1 310.378
7.1 1741.589
8.1 528.482
9.1 1241.514
10.1 377.487
11.1 738.198
12.2 989.856
13.2 738.198
14.2 520.094
15.2 6039.798
16.2 822.084
17.2 872.415
18.2 3611.5
19.2 411.042
20.2 2483.028
EOD
$w36 << EOD
1.0 251.658
2.0 394.265
3.0 309.922
4.0 343.933
5.0 260.047
6.0 251.658
7.0 343.933
8.0 394.265
9.0 360.71
10.0 327.156
11.1 251.658
12.1 222.298
13.1 301.99
14.1 247.464
15.1 213.91
16.1 205.521
17.1 360.71
18.1 343.933
19.1 360.71
20.1 343.933
EOD
set title "reading subscribers' p99 per second"
set xlabel 'seconds'
set ylabel 'ms (log scale)'
set format y '%g'
set logscale y
set yrange [*:*]
plot $w06 using 1:2 with linespoints lw 2 title 'hub', $w16 using 1:2 with linespoints lw 2 title 'nchan', $w26 using 1:2 with linespoints lw 2 title 'hummingbird', $w36 using 1:2 with linespoints lw 2 title 'python'
unset multiplot
