#!/bin/sh
B=/tmp/sparse2-mb/rr
for c in 32; do
$B 2 0 1 1 $c
$B 2 2 1 1 $c
$B 2 4 1 1 $c
$B 2 4 1 4 $c
$B 2 4 1 8 $c
$B 2 4 1 17 $c
$B 2 2 1 17 $c
$B 2 1 1 17 $c
$B 2 4 1 34 $c
done
