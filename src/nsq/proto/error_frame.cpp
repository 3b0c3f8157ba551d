#include "nsq/proto/error_frame.hpp"

namespace cg::nsq::proto {

bool is_fatal_error_code(std::string_view code) noexcept {
    return !(code == "E_FIN_FAILED" || code == "E_REQ_FAILED" || code == "E_TOUCH_FAILED");
}

error_frame classify_error(std::string_view data) noexcept {
    error_frame e;
    e.text = data;
    e.code = data.substr(0, data.find(' '));
    e.fatal = is_fatal_error_code(e.code);
    return e;
}

}  // namespace cg::nsq::proto
