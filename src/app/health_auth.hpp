// HTTP basic authentication for the health listener's guarded routes (/metrics, /config): the users and
// their password hashes come from a file (--health-basic-auth-file), one "user:hash" a line, the hash in
// crypt(3) form as `htpasswd -nB`, `mkpasswd` or `openssl passwd -6 -stdin` write it (bcrypt, yescrypt,
// SHA-crypt). No plain password is ever held by the process.
//
// A hash is computed on the offload pool, never on the event loop (bcrypt and yescrypt take tens of
// milliseconds by design). A credential that verified once is remembered as a keyed SHA-256 digest, so a
// scraper's every request after its first costs one hash, not a crypt; at most two crypts run at once, and
// a request past that is answered 429 rather than queued, so a flood of wrong passwords cannot take the
// offload pool from Stripe. Every comparison is constant-time.
#pragma once

#include <array>
#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.hpp"

namespace cg::app {

class health_auth : public std::enable_shared_from_this<health_auth> {
  public:
    enum class verdict { allowed, denied, busy };

    // Reads the file now. An error says which line is wrong and why, never what it holds.
    static result<std::shared_ptr<health_auth>> load(const std::string& path);

    // Whether `authorization` (the request's Authorization header, empty when absent) proves one of the
    // users. Call on the event loop; crypt runs on `offload`.
    asio::awaitable<verdict> check(std::string authorization, asio::any_io_executor offload);

    std::size_t users() const noexcept { return entries_.size(); }

    // The realm the 401's WWW-Authenticate names.
    static constexpr const char* realm = "chargeguard";

  private:
    struct entry {
        std::string user, hash;
    };
    using digest = std::array<unsigned char, 32>;
    digest remember_key(std::string_view credentials) const;
    bool remembered(const digest& d) const;

    std::vector<entry> entries_;
    std::array<unsigned char, 32> key_{};
    std::vector<digest> verified_;  // bounded: see remember
    unsigned crypting_ = 0;
};

// What crypt(3) makes of `password` with the settings (algorithm, cost, salt) of `hash`; empty on failure.
// For the tests, which write a file the way an operator's tool would.
std::string crypt_password(const std::string& password, const std::string& setting);
// A fresh bcrypt setting (cost 5: tests only) for crypt_password.
std::string bcrypt_setting_for_tests();

}  // namespace cg::app
