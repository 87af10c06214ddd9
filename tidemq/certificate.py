"""The broker's TLS certificate: the user's files, or a self-signed one kept in the store.

Without `--tls-cert`/`--tls-key`, `serve` creates a self-signed certificate on its first start
under `{store}/config/tls/` (`cert.pem`, `key.pem`; the key readable by its owner only) and reuses
it on later starts, so that a client that trusts it once keeps trusting it.  It is valid for
`localhost`, `127.0.0.1`, `::1` and the host the broker is reached at (the advertised host, or the
listening address when it is a specific one).  A new one replaces it only when it has expired or
does not name a host it must.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

log = logging.getLogger(__name__)

TLS_DIRECTORY = Path("config") / "tls"
CERT_FILE, KEY_FILE = "cert.pem", "key.pem"
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
VALID_DAYS = 3650
_WILDCARD_HOSTS = ("", "0.0.0.0", "::", "*")


def certificate_hosts(listen: str, advertise: str) -> list[str]:
    """The names a generated certificate carries for a broker listening on `listen` and routing
    clients to `advertise` (both "HOST:PORT"; `advertise` may be empty)."""
    hosts = list(DEFAULT_HOSTS)
    for address in (advertise, listen):
        host = address.rpartition(":")[0].strip("[]") if address else ""
        if host not in _WILDCARD_HOSTS and _canonical(host) not in map(_canonical, hosts):
            hosts.append(host)
    return hosts


def certificate_files(
    store: str | Path, cert_file: str = "", key_file: str = "", hosts: list[str] | tuple[str, ...] = DEFAULT_HOSTS
) -> tuple[str, str]:
    """The certificate and key `serve` uses: the user's pair, or the store's self-signed one
    (created when missing, expired, or not naming every host in `hosts`)."""
    if cert_file or key_file:
        if not (cert_file and key_file):
            raise ValueError(
                "--tls-cert and --tls-key go together: give both files, or neither for a self-signed certificate"
            )
        for path in (cert_file, key_file):
            if not os.path.isfile(path):
                raise ValueError(f"TLS file {path} does not exist")
        return cert_file, key_file
    directory = Path(store) / TLS_DIRECTORY
    cert_path, key_path = directory / CERT_FILE, directory / KEY_FILE
    reason = _why_not_reusable(cert_path, key_path, hosts)
    if reason:
        log.info("creating a self-signed TLS certificate for %s in %s (%s)", ", ".join(hosts), directory, reason)
        _write_self_signed(directory, hosts)
    return str(cert_path), str(key_path)


def _why_not_reusable(cert_path: Path, key_path: Path, hosts) -> str:
    if not cert_path.exists() or not key_path.exists():
        return "none yet"
    try:
        certificate = x509.load_pem_x509_certificate(cert_path.read_bytes())
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound) as exc:
        return f"the existing one is unreadable: {exc}"
    now = datetime.datetime.now(datetime.UTC)
    if not certificate.not_valid_before_utc <= now < certificate.not_valid_after_utc:
        return f"the existing one expired on {certificate.not_valid_after_utc:%Y-%m-%d}"
    named = {_canonical(str(n)) for n in names.get_values_for_type(x509.DNSName)}
    named |= {_canonical(str(n)) for n in names.get_values_for_type(x509.IPAddress)}
    missing = [h for h in hosts if _canonical(h) not in named]
    return f"the existing one does not name {', '.join(missing)}" if missing else ""


def _canonical(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower()


def _write_self_signed(directory: Path, hosts) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    subject = x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "tidemq"), x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]
    )
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))  # clocks of clients a little behind
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        # its own issuer: grpc's default root store (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH) keeps only
        # certificates that may issue, so that a client can trust this one file
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # the key first: a certificate on disk always has its key beside it
    _write_atomically(directory / KEY_FILE, key_pem, 0o600)
    _write_atomically(directory / CERT_FILE, certificate.public_bytes(serialization.Encoding.PEM), 0o644)


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    temporary = path.with_name(path.name + ".tmp")
    if temporary.exists():
        temporary.unlink()
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    os.fchmod(fd, mode)  # whatever the umask
    with os.fdopen(fd, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
