#include "app/health_auth.hpp"

#include <crypt.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <cctype>
#include <fstream>

#include "net/offload.hpp"

namespace cg::app {

namespace {

// Hash forms of crypt(3) that are made for passwords: bcrypt, yescrypt, SHA-crypt. DES and MD5 crypt are
// refused (fast to brute-force once the file is read).
bool strong_hash(std::string_view h) {
    for (std::string_view p : {"$2b$", "$2y$", "$2a$", "$y$", "$6$", "$5$", "$gy$", "$7$"})
        if (h.rfind(p, 0) == 0) return true;
    return false;
}

// "Basic <base64(user:password)>" → "user:password"; empty when malformed.
std::string decode_basic(std::string_view header) {
    constexpr std::string_view scheme = "Basic ";
    if (header.size() <= scheme.size()) return {};
    for (std::size_t i = 0; i < scheme.size(); ++i)
        if (std::tolower(static_cast<unsigned char>(header[i])) !=
            std::tolower(static_cast<unsigned char>(scheme[i])))
            return {};
    auto b64 = header.substr(scheme.size());
    while (!b64.empty() && b64.front() == ' ') b64.remove_prefix(1);
    if (b64.empty() || b64.size() % 4 != 0 || b64.size() > 4096) return {};
    std::string out(b64.size() / 4 * 3, '\0');
    int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                            reinterpret_cast<const unsigned char*>(b64.data()), static_cast<int>(b64.size()));
    if (n < 0) return {};
    std::size_t pad = 0;
    if (b64.back() == '=') ++pad;
    if (b64.size() >= 2 && b64[b64.size() - 2] == '=') ++pad;
    out.resize(static_cast<std::size_t>(n) - pad);
    if (out.find(':') == std::string::npos) return {};
    return out;
}

bool same(std::string_view a, std::string_view b) {
    return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

// Runs on the offload pool: whether `password` hashes to `hash`. `known` false: the user does not exist, the
// crypt still runs (on another user's hash) so a wrong user name costs the same time as a wrong password.
asio::awaitable<bool> crypt_matches(std::string password, std::string hash, bool known) {
    auto computed = crypt_password(password, hash);
    OPENSSL_cleanse(password.data(), password.size());
    co_return known && !computed.empty() && same(computed, hash);
}

}  // namespace

std::string crypt_password(const std::string& password, const std::string& setting) {
    auto data = std::make_unique<crypt_data>();
    const char* r = crypt_r(password.c_str(), setting.c_str(), data.get());
    std::string out = r && r[0] != '*' ? std::string(r) : std::string();
    OPENSSL_cleanse(data.get(), sizeof(crypt_data));
    return out;
}

std::string bcrypt_setting_for_tests() {
    char buf[CRYPT_GENSALT_OUTPUT_SIZE];
    const char* s = crypt_gensalt_rn("$2b$", 5, nullptr, 0, buf, sizeof buf);
    return s ? std::string(s) : std::string();
}

result<std::shared_ptr<health_auth>> health_auth::load(const std::string& path) {
    std::ifstream in(path);
    if (!in) return error(core_errc::invalid_argument, path + ": cannot be read");
    auto a = std::shared_ptr<health_auth>(new health_auth());
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
        ++n;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty() || line[0] == '#') continue;
        auto colon = line.find(':');
        auto where = path + " line " + std::to_string(n) + ": ";
        if (colon == 0 || colon == std::string::npos)
            return error(core_errc::invalid_argument, where + "not user:hash");
        auto hash = line.substr(colon + 1);
        if (!strong_hash(hash))
            return error(core_errc::invalid_argument,
                         where +
                             "not a bcrypt, yescrypt or SHA-crypt hash (write one with `htpasswd -nB "
                             "USER` or `openssl passwd -6 -stdin`; a plain password is refused)");
        a->entries_.push_back({line.substr(0, colon), std::move(hash)});
    }
    if (a->entries_.empty()) return error(core_errc::invalid_argument, path + ": no user:hash line");
    if (RAND_bytes(a->key_.data(), static_cast<int>(a->key_.size())) != 1)
        return error(core_errc::invalid_argument, "no randomness for the credential cache");
    return a;
}

health_auth::digest health_auth::remember_key(std::string_view credentials) const {
    digest d{};
    unsigned len = 0;
    HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()),
         reinterpret_cast<const unsigned char*>(credentials.data()), credentials.size(), d.data(), &len);
    return d;
}

bool health_auth::remembered(const digest& d) const {
    bool found = false;
    for (const auto& v : verified_) found |= CRYPTO_memcmp(v.data(), d.data(), d.size()) == 0;
    return found;
}

asio::awaitable<health_auth::verdict> health_auth::check(std::string authorization,
                                                         asio::any_io_executor offload) {
    auto self = shared_from_this();
    auto credentials = decode_basic(authorization);
    OPENSSL_cleanse(authorization.data(), authorization.size());
    if (credentials.empty()) co_return verdict::denied;
    auto d = remember_key(credentials);
    if (remembered(d)) {
        OPENSSL_cleanse(credentials.data(), credentials.size());
        co_return verdict::allowed;
    }
    if (crypting_ >= 2) {
        OPENSSL_cleanse(credentials.data(), credentials.size());
        co_return verdict::busy;
    }
    auto colon = credentials.find(':');
    std::string user = credentials.substr(0, colon), password = credentials.substr(colon + 1);
    OPENSSL_cleanse(credentials.data(), credentials.size());
    const entry* e = nullptr;
    for (const auto& x : entries_)
        if (same(x.user, user) && !e) e = &x;
    std::string hash = e ? e->hash : entries_.front().hash;
    ++crypting_;
    bool ok = false;
    try {
        auto task = net::offload(offload, crypt_matches(std::move(password), std::move(hash), e != nullptr));
        ok = co_await std::move(task);
    } catch (...) {
        --crypting_;
        throw;
    }
    --crypting_;
    if (!ok) co_return verdict::denied;
    // A handful of distinct credentials is all a deployment uses (one per scraper); past that the oldest is
    // forgotten and costs one more crypt.
    if (verified_.size() >= 16) verified_.erase(verified_.begin());
    verified_.push_back(d);
    co_return verdict::allowed;
}

}  // namespace cg::app
