// Correctly rounded logarithm and exponential for the reported statistics (docs/spec.md §6).
//
// libm's log, log10 and exp are accurate to about half an ulp but not correctly rounded, and glibc picks one
// of several implementations by the CPU it runs on (with and without FMA): a statistic through them could
// differ in its last bit between two machines. These return the double nearest the exact value (ties to
// even), computed by MPFR, so every figure built on them is a function of its inputs alone.
#pragma once

namespace fp4lab::cr {

double log(double x);    // natural logarithm; -inf at 0, NaN below
double log10(double x);  // base-10 logarithm; -inf at 0, NaN below
double exp(double x);    // e^x, subnormal results rounded once

}  // namespace fp4lab::cr
