#include "fp4lab/crmath.hpp"

#include <mpfr.h>

namespace fp4lab::cr {
namespace {
// f(x) rounded once to a double: MPFR rounds to 53 bits in binary64's exponent range, then re-rounds in the
// subnormal range with the ternary value, so no result is rounded twice (MPFR's documented recipe).
double round_once(int (*f)(mpfr_ptr, mpfr_srcptr, mpfr_rnd_t), double x) {
  const mpfr_exp_t emin = mpfr_get_emin(), emax = mpfr_get_emax();  // per thread in a thread-safe MPFR
  mpfr_set_emin(-1073);  // binary64: smallest subnormal 2^-1074, i.e. exponent -1073 in MPFR's convention
  mpfr_set_emax(1024);
  mpfr_t in, out;
  mpfr_init2(in, 53);
  mpfr_init2(out, 53);
  mpfr_set_d(in, x, MPFR_RNDN);  // exact: 53 bits hold any double
  int t = f(out, in, MPFR_RNDN);
  t = mpfr_check_range(out, t, MPFR_RNDN);
  mpfr_subnormalize(out, t, MPFR_RNDN);
  const double r = mpfr_get_d(out, MPFR_RNDN);  // exact: out already holds a double
  mpfr_clear(in);
  mpfr_clear(out);
  mpfr_set_emin(emin);
  mpfr_set_emax(emax);
  return r;
}
}  // namespace

double log(double x) { return round_once(mpfr_log, x); }
double log10(double x) { return round_once(mpfr_log10, x); }
double exp(double x) { return round_once(mpfr_exp, x); }

}  // namespace fp4lab::cr
