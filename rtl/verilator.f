// Verilator flags shared by every build of the fp4lab RTL (lint, C++ and SystemC models).
-Wall
--assert
-O3
--x-assign fast
--x-initial fast
--trace
