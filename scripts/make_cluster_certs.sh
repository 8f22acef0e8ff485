#!/usr/bin/env bash
# Makes the TLS files of a PS cluster (docs/PS.md "Operations and security"): a CA, and for every
# host of a cluster spec a key and a certificate signed by it, valid as server and as client
# (mutual TLS), whose subjectAltName is the host's name or IP address (clients verify it).
#   scripts/make_cluster_certs.sh OUT_DIR h0:2223,h1:2223,10.0.0.3:2223 [DAYS]
# Writes OUT_DIR/ca.pem, OUT_DIR/ca.key (keep it away from the hosts), and per host
# OUT_DIR/<host>.pem and OUT_DIR/<host>.key (chmod 600). Each host's config then says
#   cluster { tls { ca: "ca.pem" cert: "<host>.pem" key: "<host>.key" } }
# Uses openssl (Debian's package; scripts/install_deps.sh installs it). Existing files are kept:
# the CA is reused, so hosts can be added later.
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
out="$1"
spec="$2"
days="${3:-825}"
mkdir -p "$out"
umask 077
if [ ! -f "$out/ca.key" ]; then
  openssl req -x509 -newkey rsa:3072 -nodes -keyout "$out/ca.key" -out "$out/ca.pem" \
    -days "$days" -subj "/CN=pstrain cluster CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2> /dev/null
fi
IFS=',' read -ra hosts <<< "$spec"
for entry in "${hosts[@]}"; do
  host="${entry%:*}"
  [ -n "$host" ] || { echo "make_cluster_certs: empty host in '$spec'" >&2; exit 2; }
  if [[ "$host" =~ ^[0-9.]+$ || "$host" == *:* ]]; then
    san="IP:$host"
  else
    san="DNS:$host"
  fi
  [ "$host" = "localhost" ] && san="DNS:localhost,IP:127.0.0.1"
  key="$out/$host.key"
  pem="$out/$host.pem"
  openssl req -newkey rsa:2048 -nodes -keyout "$key" -out "$out/$host.csr" -subj "/CN=$host" \
    2> /dev/null
  ext="$(mktemp)"
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' \
    "$san" > "$ext"
  openssl x509 -req -in "$out/$host.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" \
    -CAcreateserial -out "$pem" -days "$days" -extfile "$ext" 2> /dev/null
  rm -f "$ext" "$out/$host.csr"
  chmod 600 "$key"
  echo "make_cluster_certs: $pem ($san)"
done
