// The money machine's tables as docs/design.md prints them (machine.hpp markdown, answers_markdown), from
// transitions() and the decisions themselves.
#include <array>
#include <string>
#include <string_view>

#include "billing/machine/machine.hpp"

namespace cg::billing::machine {

std::string markdown() {
    std::string out =
        "| table | from | to | input | written by | why |\n"
        "|---|---|---|---|---|---|\n";
    for (const auto& t : transitions()) {
        out += "| " + std::string(to_string(t.on)) + " | " +
               (t.from.empty() ? "(new)" : std::string(t.from)) + " | " + std::string(t.to) + " | " +
               std::string(to_string(t.by)) + " | `" + std::string(t.command) + "` | " + std::string(t.why) +
               " |\n";
    }
    return out;
}

std::string answers_markdown() {
    using oc = stripe::outcome_class;
    struct example {
        std::string_view answer;
        oc cls;
        bool charge_id;
        std::string_view in_flight;
        std::string_view error_code;
    };
    constexpr std::array examples{
        example{"2xx, the payment settled", oc::succeeded, true, "", ""},
        example{"2xx, in flight (`processing`, a `pending` charge)", oc::succeeded, true, "processing", ""},
        example{"2xx, `requires_capture`", oc::succeeded, true, "requires_capture", ""},
        example{"2xx without a charge id", oc::succeeded, false, "", ""},
        example{"402 card_error, `requires_payment_method`", oc::declined, true, "", "card_declined"},
        example{"402 `authentication_required`, `requires_action`", oc::declined, true, "",
                "authentication_required"},
        example{"402 spend cap (vault proxy)", oc::cap_exceeded, false, "", ""},
        example{"400 idempotency_error", oc::idempotency_conflict, false, "", ""},
        example{"400/404 naming a parameter", oc::rejected, false, "", ""},
        example{"409, 429, not sent", oc::retry_same_key, false, "", ""},
        example{"401, 403, other 4xx (our setup)", oc::setup_error, false, "", ""},
        example{"5xx, timeout after sending", oc::indeterminate, false, "", ""},
    };
    std::string out =
        "| answer | charge: command | row | NSQ | verdict | dead letter | alert | move: command | move | "
        "revision "
        "|\n"
        "|---|---|---|---|---|---|---|---|---|---|\n";
    for (const auto& e : examples) {
        stripe::charge_outcome o;
        o.cls = e.cls;
        if (e.charge_id) o.charge_id = "ch_1";
        o.in_flight_status = std::string(e.in_flight);
        o.error.code = std::string(e.error_code);
        const auto a = on_answer(o);
        const auto m = on_move_answer(o);
        const auto fin = [](verdict::action act) { return act == verdict::action::finish ? "FIN" : "REQ"; };
        out += "| " + std::string(e.answer) + " | `" + std::string(to_string(a.command)) + "` | " +
               std::string(to_string(a.to)) + " | " + fin(a.nsq) + " | " + std::string(to_string(a.reason)) +
               " | " + (a.letter.empty() ? std::string("—") : std::string(a.letter)) + " | " +
               (a.alert ? "yes" : "no") + " | `" + std::string(to_string(m.command)) + "` | " +
               std::string(m.to) + " | " + std::string(m.revision_to) + " |\n";
    }
    return out;
}

}  // namespace cg::billing::machine
