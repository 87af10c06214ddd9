"""The broker's self-signed TLS certificate (tidemq.certificate): made once, kept, replaced only
when it cannot serve."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import stat

from cryptography import x509

from tidemq.certificate import certificate_files, certificate_hosts


def names(cert_file: str) -> set[str]:
    certificate = x509.load_pem_x509_certificate(open(cert_file, "rb").read())
    alternative = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(n) for n in alternative.get_values_for_type(x509.DNSName)} | \
        {str(n) for n in alternative.get_values_for_type(x509.IPAddress)}


def test_the_hosts_a_certificate_names():
    assert certificate_hosts("127.0.0.1:8081", "") == ["localhost", "127.0.0.1", "::1"]
    assert certificate_hosts("0.0.0.0:8081", "") == ["localhost", "127.0.0.1", "::1"]
    assert certificate_hosts("[::]:8081", "broker-1.example:8081") == ["localhost", "127.0.0.1", "::1", "broker-1.example"]
    assert certificate_hosts("10.0.0.5:8081", "[::0:1]:8081") == ["localhost", "127.0.0.1", "::1", "10.0.0.5"]


def test_made_once_with_a_private_key_and_reused(tmp_path):
    cert, key = certificate_files(tmp_path)
    assert (cert, key) == (str(tmp_path / "config/tls/cert.pem"), str(tmp_path / "config/tls/key.pem"))
    assert stat.S_IMODE((tmp_path / "config/tls/key.pem").stat().st_mode) == 0o600
    assert names(cert) == {"localhost", "127.0.0.1", "::1"}
    first = (open(cert, "rb").read(), open(key, "rb").read())
    assert certificate_files(tmp_path) == (cert, key)
    assert (open(cert, "rb").read(), open(key, "rb").read()) == first
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)  # the pair matches


def test_replaced_when_it_does_not_name_the_advertised_host(tmp_path):
    cert, _ = certificate_files(tmp_path)
    first = open(cert, "rb").read()
    hosts = certificate_hosts("0.0.0.0:8081", "10.1.2.3:8081")
    certificate_files(tmp_path, hosts=hosts)
    assert open(cert, "rb").read() != first
    assert names(cert) == {"localhost", "127.0.0.1", "::1", "10.1.2.3"}
    again = open(cert, "rb").read()
    certificate_files(tmp_path, hosts=hosts)
    assert open(cert, "rb").read() == again


def test_replaced_when_expired_or_unreadable(tmp_path):
    cert, key = certificate_files(tmp_path)
    original = x509.load_pem_x509_certificate(open(cert, "rb").read())
    from cryptography.hazmat.primitives import hashes, serialization

    private_key = serialization.load_pem_private_key(open(key, "rb").read(), None)
    past = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
    expired = (x509.CertificateBuilder().subject_name(original.subject).issuer_name(original.issuer)
               .public_key(private_key.public_key()).serial_number(1)
               .not_valid_before(past).not_valid_after(past + datetime.timedelta(days=1))
               .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                           x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                           x509.IPAddress(ipaddress.ip_address("::1"))]), False)
               .sign(private_key, hashes.SHA256()))
    open(cert, "wb").write(expired.public_bytes(serialization.Encoding.PEM))
    certificate_files(tmp_path)
    renewed = x509.load_pem_x509_certificate(open(cert, "rb").read())
    assert renewed.not_valid_after_utc > datetime.datetime.now(datetime.timezone.utc)
    open(cert, "wb").write(b"not a certificate")
    certificate_files(tmp_path)
    assert names(cert) == {"localhost", "127.0.0.1", "::1"}
