// `chargeguard vault list` and `vault show` (app/cmd_vault.cpp registers them): the keys with their spend
// against the cap, as a table or JSON, and one key's recent audit rows. Internal to the vault command.
#pragma once

#include <string>

#include "core/error.hpp"
#include "net/tokens.hpp"
#include "vault/store.hpp"

namespace cg::app::vault_listing {

// "chargeguard vault <what>: <error>" on stderr; returns exit code 1.
int fail(const char* what, const error& e);

// Every key with its spend, as a table, or with `json` one JSON array.
net::awaitable<int> list(vault::store& s, bool json);
// One key: its spend, then its last `audit_rows` audit rows; exit code 1 when there is no such key.
net::awaitable<int> show(vault::store& s, std::string id, int audit_rows, bool json);

}  // namespace cg::app::vault_listing
