//! The serving certificate: loaded from `--tls-cert`/`--tls-key`, swapped in
//! without a restart when the files change, kept when the new pair is broken.
//!
//! Kubernetes updates a Secret volume by writing a new timestamped directory
//! and renaming a `..data` symlink over the old one; the files the server was
//! told about are symlinks through `..data`. Watching the files themselves
//! misses that (the inode never changes), so [`watch`] watches the
//! directories that contain them, and also polls as a fallback. Each reload
//! reads both files, parses the whole chain and key, checks that the key
//! belongs to the certificate, and only then swaps; the resolver hands every
//! new TLS handshake the pair in force at that moment, so open connections
//! keep going and new ones get the new certificate.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};
use thiserror::Error;

use trainwire_runtime::watch::{DirWatch, Timing};

use crate::metrics::{Metrics, ReloadResult};

/// Why a certificate/key pair could not be used.
#[derive(Debug, Error)]
pub enum CertError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: no PEM \"CERTIFICATE\" block found")]
    NoCertificate { path: PathBuf },
    #[error("{path}: bad PEM certificate: {detail}")]
    BadCertificatePem { path: PathBuf, detail: String },
    #[error(
        "{path}: no PEM private key found (accepted: PKCS#8 \"PRIVATE KEY\", \"EC PRIVATE KEY\", \"RSA PRIVATE KEY\"): {detail}"
    )]
    BadKeyPem { path: PathBuf, detail: String },
    #[error("{path}: unusable private key: {detail}")]
    BadKey { path: PathBuf, detail: String },
    #[error("{cert}: the certificate does not match the private key in {key}: {detail}")]
    KeyMismatch {
        cert: PathBuf,
        key: PathBuf,
        detail: String,
    },
    #[error("{path}: the first certificate is not valid X.509: {detail}")]
    BadX509 { path: PathBuf, detail: String },
}

/// A parsed pair, ready to serve.
#[derive(Debug)]
pub struct LoadedPair {
    pub key: Arc<CertifiedKey>,
    /// The leaf's notAfter, Unix seconds.
    pub not_after: i64,
    /// The leaf's subject, for logs.
    pub subject: String,
}

/// Read and fully parse a certificate chain and its private key, as the
/// server does on a reload (the certificates' tests load what they wrote).
#[cfg(test)]
pub(crate) fn load_pair(cert_path: &Path, key_path: &Path) -> Result<LoadedPair, CertError> {
    let cert_pem = std::fs::read(cert_path).map_err(|source| CertError::Read {
        path: cert_path.to_path_buf(),
        source,
    })?;
    let key_pem = std::fs::read(key_path).map_err(|source| CertError::Read {
        path: key_path.to_path_buf(),
        source,
    })?;
    parse_pair(&cert_pem, &key_pem, cert_path, key_path)
}

fn parse_pair(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_path: &Path,
    key_path: &Path,
) -> Result<LoadedPair, CertError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CertError::BadCertificatePem {
            path: cert_path.to_path_buf(),
            detail: e.to_string(),
        })?;
    let Some(leaf) = chain.first() else {
        return Err(CertError::NoCertificate {
            path: cert_path.to_path_buf(),
        });
    };
    let (not_after, subject) = match x509_parser::parse_x509_certificate(leaf) {
        Ok((_, x509)) => (
            x509.validity().not_after.timestamp(),
            x509.subject().to_string(),
        ),
        Err(e) => {
            return Err(CertError::BadX509 {
                path: cert_path.to_path_buf(),
                detail: e.to_string(),
            });
        }
    };
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| CertError::BadKeyPem {
        path: key_path.to_path_buf(),
        detail: e.to_string(),
    })?;
    let provider = rustls::crypto::ring::default_provider();
    let signing_key =
        provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| CertError::BadKey {
                path: key_path.to_path_buf(),
                detail: e.to_string(),
            })?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(e) => {
            return Err(CertError::KeyMismatch {
                cert: cert_path.to_path_buf(),
                key: key_path.to_path_buf(),
                detail: e.to_string(),
            });
        }
    }
    Ok(LoadedPair {
        key: Arc::new(certified),
        not_after,
        subject,
    })
}

/// What a [`CertStore::reload`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Reload {
    /// The files are the ones already tried: nothing to do.
    Unchanged,
    /// A new pair is in service.
    Loaded,
    /// The new files are broken; the previous pair (if any) stays in service.
    Failed(String),
}

/// The pair in service, and where it comes from.
pub struct CertStore {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: ArcSwapOption<CertifiedKey>,
    /// Hash of the last file contents tried, so a poll or a burst of events
    /// on the same files does nothing.
    last_seen: Mutex<Option<[u8; 32]>>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for CertStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertStore")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .field("loaded", &self.is_loaded())
            .finish()
    }
}

impl CertStore {
    pub fn new(cert_path: PathBuf, key_path: PathBuf, metrics: Arc<Metrics>) -> Self {
        CertStore {
            cert_path,
            key_path,
            current: ArcSwapOption::empty(),
            last_seen: Mutex::new(None),
            metrics,
        }
    }

    pub fn is_loaded(&self) -> bool {
        self.current.load().is_some()
    }

    /// The pair in service.
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.current.load_full()
    }

    /// Read the files again; swap in the new pair only if it is complete and
    /// consistent. Logs what happened and counts it in the metrics.
    pub fn reload(&self) -> Reload {
        let cert_pem = std::fs::read(&self.cert_path);
        let key_pem = std::fs::read(&self.key_path);
        let fingerprint = match (&cert_pem, &key_pem) {
            (Ok(c), Ok(k)) => {
                let mut h = Sha256::new();
                h.update((c.len() as u64).to_le_bytes());
                h.update(c);
                h.update(k);
                Some(<[u8; 32]>::from(h.finalize()))
            }
            _ => None,
        };
        {
            let mut last = self.last_seen.lock().unwrap_or_else(|p| p.into_inner());
            if fingerprint.is_some() && *last == fingerprint {
                return Reload::Unchanged;
            }
            // Unreadable files are retried at every event and poll, but the
            // failure is counted once until the files change.
            if fingerprint.is_none() && last.is_some_and(|l| l == [0; 32]) {
                return Reload::Unchanged;
            }
            *last = Some(fingerprint.unwrap_or([0; 32]));
        }
        let result = match (cert_pem, key_pem) {
            (Err(source), _) => Err(CertError::Read {
                path: self.cert_path.clone(),
                source,
            }),
            (_, Err(source)) => Err(CertError::Read {
                path: self.key_path.clone(),
                source,
            }),
            (Ok(c), Ok(k)) => parse_pair(&c, &k, &self.cert_path, &self.key_path),
        };
        match result {
            Ok(pair) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs() as i64)
                    .unwrap_or(0);
                if pair.not_after < now {
                    tracing::warn!(
                        subject = %pair.subject,
                        not_after = pair.not_after,
                        "the serving certificate has expired; the apiserver will refuse it"
                    );
                }
                self.current.store(Some(pair.key));
                self.metrics.cert_expiry.set(pair.not_after);
                Metrics::reload(&self.metrics.cert_reloads, ReloadResult::success);
                tracing::info!(
                    cert = %self.cert_path.display(),
                    subject = %pair.subject,
                    not_after = pair.not_after,
                    "serving certificate loaded"
                );
                Reload::Loaded
            }
            Err(e) => {
                Metrics::reload(&self.metrics.cert_reloads, ReloadResult::failure);
                let keeping = if self.is_loaded() {
                    "keeping the previous certificate in service"
                } else {
                    "no certificate in service yet: TLS handshakes fail and /readyz reports not ready"
                };
                tracing::error!(error = %e, "serving certificate not reloaded; {keeping}");
                Reload::Failed(e.to_string())
            }
        }
    }

    fn watched_dirs(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = [&self.cert_path, &self.key_path]
            .iter()
            .map(|p| match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            })
            .collect();
        dirs.dedup();
        dirs
    }
}

/// The resolver rustls asks at every handshake.
#[derive(Debug)]
pub struct Resolver(pub Arc<CertStore>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.current()
    }
}

/// A rustls server configuration (ring provider, TLS 1.2 and 1.3, ALPN h2
/// and http/1.1) that serves whatever pair `store` holds at handshake time.
pub fn server_config(store: Arc<CertStore>) -> Result<rustls::ServerConfig, rustls::Error> {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_cert_resolver(Arc::new(Resolver(store)));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// How long to let a burst of file events settle before reading the files.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// Fallback poll, for file systems where inotify sees nothing.
const POLL: Duration = Duration::from_secs(30);

/// Reload `store` whenever its files' directories change, and every
/// [`POLL`] as a fallback. Runs until the task is aborted.
pub async fn watch(store: Arc<CertStore>) {
    watch_with_poll(store, POLL).await
}

/// [`watch`] with a chosen poll interval.
pub async fn watch_with_poll(store: Arc<CertStore>, poll: Duration) {
    let mut changes = DirWatch::new(
        "certificate",
        &store.watched_dirs(),
        Timing {
            debounce: DEBOUNCE,
            poll,
            poll_without_watch: poll,
        },
    );
    loop {
        changes.changed().await;
        if matches!(reload_blocking(&store).await, Reload::Failed(_)) {
            // The files may have been caught half-swapped (certificate new,
            // key old): read them once more after the swap settles. Files
            // that did not change are not parsed or counted again.
            tokio::time::sleep(DEBOUNCE * 3).await;
            reload_blocking(&store).await;
        }
    }
}

async fn reload_blocking(store: &Arc<CertStore>) -> Reload {
    let store = store.clone();
    tokio::task::spawn_blocking(move || store.reload())
        .await
        .unwrap_or_else(|e| Reload::Failed(format!("reload task failed: {e}")))
}
