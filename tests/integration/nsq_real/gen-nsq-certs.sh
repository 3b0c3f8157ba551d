#!/bin/sh
# Throwaway PKI for the real-broker TLS tests, generated at build time and never committed:
#   ca.pem              test CA (nsqd verifies client certificates with it, chargeguard verifies nsqd)
#   server.pem/.key     nsqd's leaf for localhost and 127.0.0.1
#   client.pem/.key     a client certificate (clientAuth) for --tls-client-auth-policy=require-verify
#   other-ca.pem        an unrelated CA (the "wrong CA" test)
set -eu
out=$1
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
days=3650
mkca() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days $days \
    -subj "$2" -keyout "$tmp/$1.key" -out "$tmp/$1.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}
leaf() {  # name subject extendedKeyUsage [subjectAltName]
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$2" \
    -keyout "$tmp/$1.key" -out "$tmp/$1.csr" 2>/dev/null
  { echo "basicConstraints=critical,CA:FALSE"; echo "keyUsage=critical,digitalSignature"; echo "extendedKeyUsage=$3"
    [ -n "${4:-}" ] && echo "subjectAltName=$4"; } > "$tmp/$1.cnf"
  openssl x509 -req -in "$tmp/$1.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" -CAcreateserial \
    -days $days -extfile "$tmp/$1.cnf" -out "$tmp/$1.pem" 2>/dev/null
}
mkca ca "/CN=chargeguard nsq test CA"
mkca other-ca "/CN=unrelated nsq test CA"
leaf server "/CN=localhost" serverAuth "DNS:localhost,IP:127.0.0.1"
leaf client "/CN=chargeguard-client" clientAuth
cp "$tmp/ca.pem" "$tmp/other-ca.pem" "$tmp/server.pem" "$tmp/server.key" "$tmp/client.pem" "$tmp/client.key" "$out/"
