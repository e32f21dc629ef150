#!/bin/sh
B=/tmp/sparse2-mb/rr
$B 2 0 1 1
$B 2 2 1 1
$B 2 4 1 1
$B 2 8 1 1
$B 2 4 0 1
$B 2 4 1 2
$B 2 4 1 4
$B 2 16 1 4
$B 1 0 1 1
$B 1 4 1 1
$B 2 4 1 1 4
