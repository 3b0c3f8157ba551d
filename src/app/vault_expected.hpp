// `vault issue --expected-file`: the expected total of one billing period (billing/report/expected_run.hpp).
#pragma once

#include "billing/report/expected_run.hpp"

namespace cg::app {

using billing::expected_total;
using billing::sum_expected;

}  // namespace cg::app
