#include "core/error.hpp"

namespace cg {
namespace {

const char* describe_core(int v) noexcept {
    switch (static_cast<core_errc>(v)) {
        case core_errc::ok:
            return "ok";
        case core_errc::invalid_argument:
            return "invalid argument";
        case core_errc::parse_error:
            return "parse error";
        case core_errc::out_of_range:
            return "out of range";
        case core_errc::not_found:
            return "not found";
        case core_errc::io_error:
            return "i/o error";
    }
    return "unknown core error";
}

}  // namespace

const std::error_category& core_category() noexcept {
    static const simple_category cat("chargeguard.core", describe_core);
    return cat;
}

std::string error::describe() const {
    std::string out = code.category().name();
    out += ": ";
    out += code.message();
    if (!message.empty()) {
        out += "; ";
        out += message;
    }
    return out;
}

std::string describe_exception(std::exception_ptr ep) {
    if (!ep) return "no exception";
    try {
        std::rethrow_exception(ep);
    } catch (const std::exception& e) {
        return e.what();
    } catch (...) {
        return "unknown exception";
    }
}

}  // namespace cg
