//! `trainwire-webhook certs`: a CA and a serving certificate for a self-managed setup.
//!
//! Writes `ca.crt`, `ca.key`, `tls.crt` and `tls.key` (ECDSA P-256; the key
//! files mode 0600) to `--out`, and prints the CA as the base64 `caBundle`
//! for the MutatingWebhookConfiguration on stdout.

use std::io::Write;
use std::path::Path;

use clap::Args;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
};
use thiserror::Error;

#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Name of the webhook's Service.
    #[arg(long, env = "TRAINWIRE_CERTS_SERVICE")]
    pub service: String,
    /// Namespace of the webhook's Service.
    #[arg(long, env = "TRAINWIRE_CERTS_NAMESPACE")]
    pub namespace: String,
    /// Directory to write `ca.crt`, `ca.key`, `tls.crt` and `tls.key` to.
    #[arg(long, env = "TRAINWIRE_CERTS_OUT")]
    pub out: std::path::PathBuf,
    /// Validity of the CA and the serving certificate, in days.
    #[arg(long, env = "TRAINWIRE_CERTS_DAYS", default_value_t = 3650)]
    pub days: u32,
}

#[derive(Debug, Error)]
pub enum CertsError {
    #[error("{0}")]
    Invalid(String),
    #[error("cannot generate the certificates: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("cannot write {path}: {source}")]
    Write {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// The generated PEM files.
#[derive(Debug)]
pub struct Generated {
    pub ca_cert_pem: String,
    pub ca_key_pem: String,
    pub tls_cert_pem: String,
    pub tls_key_pem: String,
}

impl Generated {
    /// The CA certificate PEM, base64: the webhook configuration's `caBundle`.
    pub fn ca_bundle(&self) -> String {
        base64(self.ca_cert_pem.as_bytes())
    }
}

/// The DNS names the apiserver may use for the Service.
pub fn service_dns_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        service.to_string(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

fn check_dns_label(what: &str, value: &str) -> Result<(), CertsError> {
    let ok = !value.is_empty()
        && value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(CertsError::Invalid(format!(
            "--{what} {value:?} is not a valid DNS label: use 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit"
        )))
    }
}

/// Generate a CA and a serving certificate for `service`.`namespace`.
pub fn generate(service: &str, namespace: &str, days: u32) -> Result<Generated, CertsError> {
    check_dns_label("service", service)?;
    check_dns_label("namespace", namespace)?;
    if days == 0 {
        return Err(CertsError::Invalid("--days must be at least 1".to_string()));
    }
    let now = time::OffsetDateTime::now_utc();
    let not_before = now - time::Duration::hours(1);
    let not_after = now + time::Duration::days(i64::from(days));

    let ca_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.distinguished_name = DistinguishedName::new();
    ca_params.distinguished_name.push(
        DnType::CommonName,
        format!("trainwire webhook CA ({namespace}/{service})"),
    );
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params.not_before = not_before;
    ca_params.not_after = not_after;
    let ca_key_pem = ca_key.serialize_pem();
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key)?;

    let tls_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let mut params = CertificateParams::new(service_dns_names(service, namespace))?;
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("{service}.{namespace}.svc"));
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = not_before;
    params.not_after = not_after;
    let tls_cert = params.signed_by(&tls_key, &ca)?;

    Ok(Generated {
        ca_cert_pem: ca.pem(),
        ca_key_pem,
        tls_cert_pem: tls_cert.pem(),
        tls_key_pem: tls_key.serialize_pem(),
    })
}

fn write_file(dir: &Path, name: &str, contents: &str, secret: bool) -> Result<(), CertsError> {
    let path = dir.join(name);
    let err = |source| CertsError::Write {
        path: path.clone(),
        source,
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if secret { 0o600 } else { 0o644 });
    }
    let mut file = options.open(&path).map_err(err)?;
    #[cfg(unix)]
    if secret {
        // An existing file keeps its mode on open: tighten it.
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(err)?;
    }
    file.write_all(contents.as_bytes()).map_err(err)?;
    file.sync_all().map_err(err)
}

/// Write the four files to `dir` (created if missing).
pub fn write(generated: &Generated, dir: &Path) -> Result<(), CertsError> {
    std::fs::create_dir_all(dir).map_err(|source| CertsError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    write_file(dir, "ca.crt", &generated.ca_cert_pem, false)?;
    write_file(dir, "ca.key", &generated.ca_key_pem, true)?;
    write_file(dir, "tls.crt", &generated.tls_cert_pem, false)?;
    write_file(dir, "tls.key", &generated.tls_key_pem, true)?;
    Ok(())
}

pub fn run(args: CertsArgs) -> anyhow::Result<()> {
    let generated = generate(&args.service, &args.namespace, args.days)?;
    write(&generated, &args.out)?;
    eprintln!(
        "wrote {dir}/ca.crt, ca.key, tls.crt, tls.key for {names}; the caBundle follows on stdout",
        dir = args.out.display(),
        names = service_dns_names(&args.service, &args.namespace).join(", "),
    );
    println!("{}", generated.ca_bundle());
    Ok(())
}

/// Standard base64 with padding (RFC 4648), as Kubernetes `[]byte` fields use.
fn base64(input: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(input)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::pem::PemObject;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (input, expected) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), expected);
        }
    }

    #[test]
    fn serving_certificate_names_the_service_and_chains_to_the_ca() {
        let generated = generate("trainwire-webhook", "trainwire-system", 30).expect("generate");
        let leaf =
            rustls_pki_types::CertificateDer::from_pem_slice(generated.tls_cert_pem.as_bytes())
                .expect("leaf pem");
        let (_, x509) = x509_parser::parse_x509_certificate(&leaf).expect("leaf x509");
        let sans: Vec<String> = x509
            .subject_alternative_name()
            .expect("san ext")
            .expect("has sans")
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        for name in service_dns_names("trainwire-webhook", "trainwire-system") {
            assert!(
                sans.iter().any(|s| s.contains(&name)),
                "{name} missing from {sans:?}"
            );
        }
        assert!(!x509.is_ca());
        let validity = x509.validity();
        let days = (validity.not_after.timestamp() - validity.not_before.timestamp()) / 86400;
        assert!((30..=31).contains(&days), "{days} days");

        // The leaf verifies against the CA with webpki, as the apiserver would.
        let ca = rustls_pki_types::CertificateDer::from_pem_slice(generated.ca_cert_pem.as_bytes())
            .expect("ca pem");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca).expect("ca as root");
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            std::sync::Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .expect("verifier");
        let name = rustls_pki_types::ServerName::try_from("trainwire-webhook.trainwire-system.svc")
            .expect("name");
        use rustls::client::danger::ServerCertVerifier;
        verifier
            .verify_server_cert(&leaf, &[], &name, &[], rustls_pki_types::UnixTime::now())
            .expect("the serving certificate verifies for the Service name");

        // The key pair loads as the server loads it.
        let dir = tempfile::tempdir().expect("tempdir");
        write(&generated, dir.path()).expect("write");
        crate::tls::load_pair(&dir.path().join("tls.crt"), &dir.path().join("tls.key"))
            .expect("the written pair loads");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            for (file, mode) in [("ca.key", 0o600), ("tls.key", 0o600)] {
                let meta = std::fs::metadata(dir.path().join(file)).expect("stat");
                assert_eq!(meta.permissions().mode() & 0o777, mode, "{file}");
            }
        }
        assert_eq!(
            generated.ca_bundle(),
            base64(generated.ca_cert_pem.as_bytes())
        );
    }

    #[test]
    fn bad_service_names_are_refused_with_the_rule() {
        let err = generate("Bad_Name", "ns", 30).expect_err("refused");
        assert!(err.to_string().contains("--service \"Bad_Name\""), "{err}");
    }
}
