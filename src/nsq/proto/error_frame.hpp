// Error frames: "E_<CODE> <text>". Which codes are fatal (nsqd closes the connection after sending).
#pragma once

#include <string_view>

namespace cg::nsq::proto {

struct error_frame {
    std::string_view code;  // "E_FIN_FAILED"
    std::string_view text;  // the whole frame data, for logs
    bool fatal = true;
};

// Only E_FIN_FAILED, E_REQ_FAILED and E_TOUCH_FAILED leave the connection open; anything else
// (including codes we do not know) is treated as fatal, as nsqd closes after every other error.
error_frame classify_error(std::string_view data) noexcept;
bool is_fatal_error_code(std::string_view code) noexcept;

}  // namespace cg::nsq::proto
