// A test-only front end to the webhook signature verifier, so the official Stripe SDK's signer can be
// checked against it (tests/stripe-sdk/webhook-signature.mjs). Reads the raw body from stdin, the header
// from CG_TEST_SIGNATURE_HEADER and the secrets (one a line, current first) from CG_TEST_WEBHOOK_SECRETS;
// argv[1], when given, is the tolerance in seconds. Prints the verdict's status and exits 0 only on "ok".
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "stripe/webhook_signature.hpp"

int main(int argc, char** argv) {
    const char* header = std::getenv("CG_TEST_SIGNATURE_HEADER");
    const char* secrets_env = std::getenv("CG_TEST_WEBHOOK_SECRETS");
    std::vector<std::string> secrets;
    std::istringstream lines(secrets_env ? secrets_env : "");
    for (std::string line; std::getline(lines, line);) secrets.push_back(line);
    std::string body{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
    auto tolerance =
        argc > 1 ? std::chrono::seconds(std::atoll(argv[1])) : cg::stripe::default_webhook_tolerance;
    auto now =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    auto v = cg::stripe::verify_signature(header ? header : "", body, secrets, now, tolerance);
    std::cout << cg::stripe::to_string(v.status) << "\n";
    return v.ok() ? 0 : 1;
}
