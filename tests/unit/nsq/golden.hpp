// Byte vectors from ../shared/specs/nsqd-1.3.0-golden.md (real nsqd 1.3.0 on loopback).
#pragma once

#include <string>
#include <string_view>

#include "core/bytes.hpp"

namespace golden {

inline std::string bytes(std::string_view spaced_hex) {
    std::string hex;
    for (char c : spaced_hex)
        if (c != ' ') hex += c;
    auto b = cg::from_hex(hex);
    return b ? std::string(b->begin(), b->end()) : std::string("<bad hex>");
}

inline const std::string magic = bytes("20 20 56 32");
inline const std::string identify_response = bytes(
    "00 00 01 0b 00 00 00 00 7b 22 6d 61 78 5f 72 64 79 5f 63 6f 75 6e 74 22 3a 32 35 30 30 2c 22 76 65 72 "
    "73 69 "
    "6f 6e 22 3a 22 31 2e 33 2e 30 22 2c 22 6d 61 78 5f 6d 73 67 5f 74 69 6d 65 6f 75 74 22 3a 39 30 30 30 "
    "30 30 "
    "2c 22 6d 73 67 5f 74 69 6d 65 6f 75 74 22 3a 35 30 30 30 2c 22 74 6c 73 5f 76 31 22 3a 66 61 6c 73 65 "
    "2c 22 "
    "64 65 66 6c 61 74 65 22 3a 66 61 6c 73 65 2c 22 64 65 66 6c 61 74 65 5f 6c 65 76 65 6c 22 3a 36 2c 22 "
    "6d 61 "
    "78 5f 64 65 66 6c 61 74 65 5f 6c 65 76 65 6c 22 3a 36 2c 22 73 6e 61 70 70 79 22 3a 66 61 6c 73 65 2c "
    "22 73 "
    "61 6d 70 6c 65 5f 72 61 74 65 22 3a 30 2c 22 61 75 74 68 5f 72 65 71 75 69 72 65 64 22 3a 66 61 6c 73 "
    "65 2c "
    "22 6f 75 74 70 75 74 5f 62 75 66 66 65 72 5f 73 69 7a 65 22 3a 31 36 33 38 34 2c 22 6f 75 74 70 75 74 "
    "5f 62 "
    "75 66 66 65 72 5f 74 69 6d 65 6f 75 74 22 3a 32 35 30 7d");
inline const std::string sub = bytes("53 55 42 20 67 6f 6c 64 65 6e 20 63 0a");
inline const std::string ok_frame = bytes("00 00 00 06 00 00 00 00 4f 4b");
inline const std::string rdy1 = bytes("52 44 59 20 31 0a");
inline const std::string message_frame = bytes(
    "00 00 00 2a 00 00 00 02 18 ec 97 2f 54 eb d0 e9 00 01 31 38 61 64 33 39 37 63 62 66 61 36 39 30 30 30 "
    "68 65 "
    "6c 6c 6f 20 67 6f 6c 64 65 6e");
inline const std::string touch =
    bytes("54 4f 55 43 48 20 31 38 61 64 33 39 37 63 62 66 61 36 39 30 30 30 0a");
inline const std::string fin = bytes("46 49 4e 20 31 38 61 64 33 39 37 63 62 66 61 36 39 30 30 30 0a");
inline const std::string fin_failed = bytes(
    "00 00 00 3d 00 00 00 01 45 5f 46 49 4e 5f 46 41 49 4c 45 44 20 46 49 4e 20 31 38 61 64 33 39 37 63 62 "
    "66 61 "
    "36 39 30 30 30 20 66 61 69 6c 65 64 20 49 44 20 6e 6f 74 20 69 6e 20 66 6c 69 67 68 74");
inline const std::string req_unknown =
    bytes("52 45 51 20 30 30 30 30 30 30 30 30 30 30 30 30 30 30 30 30 20 30 0a");
inline const std::string req_failed = bytes(
    "00 00 00 3d 00 00 00 01 45 5f 52 45 51 5f 46 41 49 4c 45 44 20 52 45 51 20 30 30 30 30 30 30 30 30 30 "
    "30 30 "
    "30 30 30 30 30 20 66 61 69 6c 65 64 20 49 44 20 6e 6f 74 20 69 6e 20 66 6c 69 67 68 74");
inline const std::string heartbeat = bytes("00 00 00 0f 00 00 00 00 5f 68 65 61 72 74 62 65 61 74 5f");
inline const std::string nop = bytes("4e 4f 50 0a");
inline const std::string cls = bytes("43 4c 53 0a");
inline const std::string close_wait = bytes("00 00 00 0e 00 00 00 00 43 4c 4f 53 45 5f 57 41 49 54");
inline const std::string rdy3000 = bytes("52 44 59 20 33 30 30 30 0a");
inline const std::string rdy_invalid = bytes(
    "00 00 00 30 00 00 00 01 45 5f 49 4e 56 41 4c 49 44 20 52 44 59 20 63 6f 75 6e 74 20 33 30 30 30 20 6f "
    "75 74 "
    "20 6f 66 20 72 61 6e 67 65 20 30 2d 32 35 30 30");
inline const std::string identify_big_timeout = bytes(
    "49 44 45 4e 54 49 46 59 0a 00 00 00 35 7b 22 66 65 61 74 75 72 65 5f 6e 65 67 6f 74 69 61 74 69 6f 6e "
    "22 3a "
    "20 74 72 75 65 2c 20 22 6d 73 67 5f 74 69 6d 65 6f 75 74 22 3a 20 31 30 30 30 30 30 30 7d");
inline const std::string bad_body = bytes(
    "00 00 00 38 00 00 00 01 45 5f 42 41 44 5f 42 4f 44 59 20 49 44 45 4e 54 49 46 59 20 6d 73 67 20 74 69 "
    "6d 65 "
    "6f 75 74 20 28 31 30 30 30 30 30 30 29 20 69 73 20 69 6e 76 61 6c 69 64");
inline const std::string identify_no_heartbeat = bytes(
    "49 44 45 4e 54 49 46 59 0a 00 00 00 37 7b 22 66 65 61 74 75 72 65 5f 6e 65 67 6f 74 69 61 74 69 6f 6e "
    "22 3a "
    "20 74 72 75 65 2c 20 22 68 65 61 72 74 62 65 61 74 5f 69 6e 74 65 72 76 61 6c 22 3a 20 2d 31 7d");
inline const std::string identify_response_60000 = bytes(
    "00 00 01 0c 00 00 00 00 7b 22 6d 61 78 5f 72 64 79 5f 63 6f 75 6e 74 22 3a 32 35 30 30 2c 22 76 65 72 "
    "73 69 "
    "6f 6e 22 3a 22 31 2e 33 2e 30 22 2c 22 6d 61 78 5f 6d 73 67 5f 74 69 6d 65 6f 75 74 22 3a 39 30 30 30 "
    "30 30 "
    "2c 22 6d 73 67 5f 74 69 6d 65 6f 75 74 22 3a 36 30 30 30 30 2c 22 74 6c 73 5f 76 31 22 3a 66 61 6c 73 "
    "65 2c "
    "22 64 65 66 6c 61 74 65 22 3a 66 61 6c 73 65 2c 22 64 65 66 6c 61 74 65 5f 6c 65 76 65 6c 22 3a 36 2c "
    "22 6d "
    "61 78 5f 64 65 66 6c 61 74 65 5f 6c 65 76 65 6c 22 3a 36 2c 22 73 6e 61 70 70 79 22 3a 66 61 6c 73 65 "
    "2c 22 "
    "73 61 6d 70 6c 65 5f 72 61 74 65 22 3a 30 2c 22 61 75 74 68 5f 72 65 71 75 69 72 65 64 22 3a 66 61 6c "
    "73 65 "
    "2c 22 6f 75 74 70 75 74 5f 62 75 66 66 65 72 5f 73 69 7a 65 22 3a 31 36 33 38 34 2c 22 6f 75 74 70 75 "
    "74 5f "
    "62 75 66 66 65 72 5f 74 69 6d 65 6f 75 74 22 3a 32 35 30 7d");
inline const std::string sub_no_heartbeat_error = bytes(
    "00 00 00 31 00 00 00 01 45 5f 49 4e 56 41 4c 49 44 20 63 61 6e 6e 6f 74 20 53 55 42 20 77 69 74 68 20 "
    "68 65 "
    "61 72 74 62 65 61 74 73 20 64 69 73 61 62 6c 65 64");
inline const std::string fin_before_sub =
    bytes("46 49 4e 20 30 30 30 30 30 30 30 30 30 30 30 30 30 30 30 30 0a");
inline const std::string fin_before_sub_error = bytes(
    "00 00 00 29 00 00 00 01 45 5f 49 4e 56 41 4c 49 44 20 63 61 6e 6e 6f 74 20 46 49 4e 20 69 6e 20 63 75 "
    "72 72 "
    "65 6e 74 20 73 74 61 74 65");
inline const std::string mpub2 =
    bytes("4d 50 55 42 20 67 6f 6c 64 65 6e 0a 00 00 00 0f 00 00 00 02 00 00 00 01 61 00 00 00 02 62 62");
inline const std::string pub_bad_topic = bytes("50 55 42 20 62 61 64 21 74 6f 70 69 63 0a 00 00 00 01 78");
inline const std::string bad_topic_error = bytes(
    "00 00 00 37 00 00 00 01 45 5f 42 41 44 5f 54 4f 50 49 43 20 50 55 42 20 74 6f 70 69 63 20 6e 61 6d 65 "
    "20 22 "
    "62 61 64 21 74 6f 70 69 63 22 20 69 73 20 6e 6f 74 20 76 61 6c 69 64");

}  // namespace golden
