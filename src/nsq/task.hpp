// What a failed background task threw, for the log line of the completion handler that restarts it or
// stops loudly (STYLE.md: never an empty completion).
#pragma once

#include <exception>
#include <string>

namespace cg::nsq {

inline std::string describe_exception(std::exception_ptr ep) {
    try {
        std::rethrow_exception(ep);
    } catch (const std::exception& e) {
        return e.what();
    } catch (...) {
        return "unknown exception";
    }
}

}  // namespace cg::nsq
