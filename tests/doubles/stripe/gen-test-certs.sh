#!/bin/sh
# Throwaway test PKI, generated at build time and never committed:
#   ca.pem            test CA (trusted by the tests and by NODE_EXTRA_CA_CERTS)
#   server.pem/.key   leaf for localhost and 127.0.0.1, signed by ca.pem
#   other-ca.pem      an unrelated CA (the "wrong CA → clear TLS error" test)
set -eu
out=$1
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
days=3650
mkca() {  # name subject
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days $days \
    -subj "$2" -keyout "$tmp/$1.key" -out "$tmp/$1.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}
mkca ca "/CN=chargeguard test CA"
mkca other-ca "/CN=unrelated test CA"
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=localhost" \
  -keyout "$tmp/server.key" -out "$tmp/server.csr" 2>/dev/null
cat > "$tmp/ext.cnf" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,IP:127.0.0.1
EXT
openssl x509 -req -in "$tmp/server.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" -CAcreateserial \
  -days $days -extfile "$tmp/ext.cnf" -out "$tmp/server.pem" 2>/dev/null
cp "$tmp/ca.pem" "$tmp/other-ca.pem" "$tmp/server.pem" "$tmp/server.key" "$out/"
