// What a failed background task threw: the one description in core, under the name the NSQ module's
// completion handlers use.
#pragma once

#include "core/error.hpp"

namespace cg::nsq {

using cg::describe_exception;

}  // namespace cg::nsq
