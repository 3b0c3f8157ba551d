#include "pg/params.hpp"

namespace cg::pg {

params& params::push(std::string v, bool is_null, unsigned type_oid, int format) {
    lengths_.push_back(static_cast<int>(v.size()));
    values_.push_back(std::move(v));
    null_.push_back(is_null ? 1 : 0);
    types_.push_back(type_oid);
    formats_.push_back(format);
    return *this;
}

params& params::add_text(std::string v, unsigned type_oid) {
    return push(std::move(v), false, type_oid, 0);
}

params& params::add(null_t) {
    return push({}, true, oid::unknown, 0);
}

params& params::add(bool v) {
    return add_text(v ? "t" : "f", oid::bool_);
}

params& params::add(timestamp t) {
    return add_text(format_timestamptz(t), oid::timestamptz);
}

params& params::add(std::span<const std::uint8_t> v) {
    return push(std::string(reinterpret_cast<const char*>(v.data()), v.size()), false, oid::bytea, 1);
}

void params::reserve(std::size_t n) {
    values_.reserve(n);
    null_.reserve(n);
    types_.reserve(n);
    lengths_.reserve(n);
    formats_.reserve(n);
}

const char* const* params::values() const {
    ptrs_.resize(values_.size());
    for (std::size_t i = 0; i < values_.size(); ++i) ptrs_[i] = null_[i] ? nullptr : values_[i].c_str();
    return ptrs_.data();
}

}  // namespace cg::pg
