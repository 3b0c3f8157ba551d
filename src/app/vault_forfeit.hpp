// `chargeguard vault forfeit-lease` (app/cmd_vault.cpp registers it): gives back the cap lease a dead proxy
// left open (cg_vault_lease_forfeit, docs/operating/vault.md), one lease at a time, an expired one unless
// forced. Internal to the vault command.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "app/pg_flags.hpp"
#include "net/tokens.hpp"
#include "vault/store.hpp"

namespace cg::app::vault_forfeit {

struct flags {
    pg_flags pg;
    std::string id, holder;
    std::optional<std::int64_t> lease;
    std::int64_t keep_cents = 0;
    bool force = false;
};

// The one open lease the flags name (by --lease, else --holder, else the key's only one); exit code 1 when
// none or several match, or when it has not expired and --force is not given. Says what it did on stderr.
net::awaitable<int> forfeit_lease(vault::store& s, flags f);

}  // namespace cg::app::vault_forfeit
