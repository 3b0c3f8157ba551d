// Asio is compiled once, here (ASIO_SEPARATE_COMPILATION), to keep every other translation unit light.
#include <asio/impl/src.hpp>
#include <asio/ssl/impl/src.hpp>
