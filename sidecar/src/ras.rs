//! NCCL's RAS service (NCCL 2.24 and later): each NCCL process of the pod
//! answers on `localhost:28028` with the state of the job's communicators,
//! every rank's count of collective operations among them. Those counts
//! move when collectives complete, also where no byte crosses TCP (RDMA,
//! NVLink), so they are a progress signal where the socket diagnostics see
//! nothing ([`crate::progress`]).
//!
//! The protocol, as NCCL's own client (`ncclras`) speaks it: the client
//! sends `CLIENT PROTOCOL 2`, NCCL answers `SERVER PROTOCOL <n>`; `SET
//! FORMAT json` is answered `OK` (NCCL versions that only print text answer
//! otherwise: then nothing is read); `STATUS` is answered with one JSON
//! document, then the connection is closed.

use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// Where NCCL's RAS service listens by default (`NCCL_RAS_ADDR`).
pub const DEFAULT_ADDR: &str = "127.0.0.1:28028";
/// The client protocol spoken.
pub const PROTOCOL: u32 = 2;
/// The longest answer read.
pub const MAX_ANSWER: u64 = 8 << 20;

/// What went wrong asking the RAS service.
#[derive(Debug, thiserror::Error)]
pub enum RasError {
    #[error("cannot reach NCCL's RAS service: {0}")]
    Connect(std::io::Error),
    #[error("NCCL's RAS service did not answer in time")]
    Timeout,
    #[error("NCCL's RAS service answered {0:?}, not the RAS protocol")]
    Protocol(String),
    #[error("NCCL's RAS service does not answer in JSON (an NCCL before its JSON format): {0:?}")]
    NoJson(String),
    #[error("NCCL's RAS status is not the JSON it documents: {0}")]
    Json(String),
    #[error("reading NCCL's RAS answer: {0}")]
    Io(std::io::Error),
}

/// The part of NCCL's `STATUS` JSON that tells progress.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct RasStatus {
    #[serde(default)]
    pub nccl_version: String,
    #[serde(default)]
    pub communicators: Vec<Communicator>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Communicator {
    #[serde(default)]
    pub hash: String,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub ranks: Vec<Rank>,
    #[serde(default)]
    pub missing_ranks: Vec<MissingRank>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Rank {
    pub rank: u64,
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub pid: i64,
    /// Collective operations completed, by kind (`AllReduce`, ...).
    #[serde(default)]
    pub collective_counts: std::collections::BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct MissingRank {
    pub rank: u64,
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub pid: i64,
    #[serde(default)]
    pub status: MissingStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct MissingStatus {
    #[serde(default)]
    pub unresponsive: bool,
    #[serde(default)]
    pub considered_dead: bool,
}

impl RasStatus {
    /// Reads NCCL's `STATUS` JSON.
    pub fn parse(text: &str) -> Result<RasStatus, RasError> {
        serde_json::from_str(text).map_err(|e| RasError::Json(e.to_string()))
    }

    /// Every rank's collective operations, summed over the communicators:
    /// it grows while any collective of the job completes.
    pub fn collectives(&self) -> u64 {
        self.communicators
            .iter()
            .flat_map(|c| c.ranks.iter())
            .flat_map(|r| r.collective_counts.values())
            .fold(0u64, |sum, n| sum.saturating_add(*n))
    }

    /// The ranks NCCL could not reach or holds dead: `(communicator, rank,
    /// host, pid, dead)`.
    pub fn missing(&self) -> Vec<(String, u64, String, i64, bool)> {
        self.communicators
            .iter()
            .flat_map(|c| {
                c.missing_ranks.iter().map(move |m| {
                    (
                        c.hash.clone(),
                        m.rank,
                        m.host.clone(),
                        m.pid,
                        m.status.considered_dead,
                    )
                })
            })
            .collect()
    }
}

/// Asks the RAS service at `addr` for the job's status, within `limit`.
pub async fn status(addr: &str, limit: Duration) -> Result<RasStatus, RasError> {
    tokio::time::timeout(limit, ask(addr))
        .await
        .map_err(|_| RasError::Timeout)?
}

async fn ask(addr: &str) -> Result<RasStatus, RasError> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(RasError::Connect)?;
    let mut stream = BufReader::new(stream);
    let mut line = String::new();
    let mut exchange = async |send: &str, line: &mut String| -> Result<(), RasError> {
        stream
            .get_mut()
            .write_all(send.as_bytes())
            .await
            .map_err(RasError::Io)?;
        line.clear();
        (&mut stream)
            .take(4096)
            .read_line(line)
            .await
            .map_err(RasError::Io)?;
        Ok(())
    };
    exchange(&format!("CLIENT PROTOCOL {PROTOCOL}\n"), &mut line).await?;
    if !line.to_ascii_uppercase().starts_with("SERVER PROTOCOL ") {
        return Err(RasError::Protocol(line.trim().to_string()));
    }
    exchange("SET FORMAT json\n", &mut line).await?;
    if !line.trim().eq_ignore_ascii_case("OK") {
        return Err(RasError::NoJson(line.trim().to_string()));
    }
    stream
        .get_mut()
        .write_all(b"STATUS\n")
        .await
        .map_err(RasError::Io)?;
    let mut text = String::new();
    stream
        .take(MAX_ANSWER)
        .read_to_string(&mut text)
        .await
        .map_err(RasError::Io)?;
    RasStatus::parse(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `STATUS` answer in the form NCCL's JSON writer prints it
    /// (`src/ras/client_support.cc`: header, communicators with their ranks'
    /// status and collective counts, missing ranks, the RAS footer).
    pub const STATUS_JSON: &str = r#"{
  "nccl_version": "2.28.3",
  "cuda_runtime_version": 12080,
  "cuda_driver_version": 12080,
  "timestamp": "2026-12-04 16:40:00",
  "communicators_count": 1,
  "communicators": [
    {
      "hash": "0x6b1a2c3d4e5f6071",
      "secondary_hash": "0x1:0x2",
      "size": 3,
      "ranks_count": 2,
      "missing_ranks_count": 1,
      "ranks": [
        {
          "rank": 0,
          "host": "10.0.0.1",
          "pid": 4242,
          "cuda_dev": 0,
          "nvml_dev": 0,
          "status": {
            "init_state": 0,
            "async_error": 0,
            "finalize_called": false,
            "destroy_flag": false,
            "abort_flag": false
          },
          "collective_counts": {
            "Broadcast": 1,
            "Reduce": 0,
            "AllGather": 0,
            "ReduceScatter": 0,
            "AllReduce": 120
          }
        },
        {
          "rank": 1,
          "host": "10.0.0.2",
          "pid": 4343,
          "cuda_dev": 0,
          "nvml_dev": 0,
          "status": {
            "init_state": 0,
            "async_error": 0,
            "finalize_called": false,
            "destroy_flag": false,
            "abort_flag": false
          },
          "collective_counts": {
            "Broadcast": 1,
            "Reduce": 0,
            "AllGather": 0,
            "ReduceScatter": 0,
            "AllReduce": 119
          }
        }
      ],
      "missing_ranks": [
        {
          "rank": 2,
          "host": "10.0.0.3",
          "pid": 4444,
          "cuda_dev": 0,
          "nvml_dev": 0,
          "status": {
            "unresponsive": true,
            "considered_dead": false
          }
        }
      ]
    }
  ],
  "ras": {
    "collection_time_sec": 0.012,
    "timeouts_count": 0
  }
}
"#;

    #[test]
    fn the_documented_status_reads_as_collectives_and_missing_ranks() {
        let s = RasStatus::parse(STATUS_JSON).expect("status");
        assert_eq!(s.nccl_version, "2.28.3");
        assert_eq!(s.collectives(), 241);
        assert_eq!(
            s.missing(),
            vec![(
                "0x6b1a2c3d4e5f6071".to_string(),
                2,
                "10.0.0.3".to_string(),
                4444,
                false
            )]
        );
        // No communicator yet: nothing completed.
        let empty = RasStatus::parse(
            r#"{"nccl_version":"2.28.3","communicators_count":0,"communicators":[],"ras":{"collection_time_sec":0.0,"timeouts_count":0}}"#,
        )
        .expect("empty");
        assert_eq!(empty.collectives(), 0);
        assert!(matches!(
            RasStatus::parse("Job summary\n==========="),
            Err(RasError::Json(_))
        ));
    }

    /// A fake RAS service speaking the protocol: the client's handshake,
    /// the format, the status; and one of an NCCL without JSON.
    #[tokio::test]
    async fn the_client_speaks_the_protocol() {
        async fn serve(json: bool) -> String {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("listen");
            let addr = listener.local_addr().expect("addr").to_string();
            tokio::spawn(async move {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let mut socket = BufReader::new(socket);
                let mut line = String::new();
                let _ = socket.read_line(&mut line).await;
                assert_eq!(line, "CLIENT PROTOCOL 2\n");
                let _ = socket.get_mut().write_all(b"SERVER PROTOCOL 2\n").await;
                line.clear();
                let _ = socket.read_line(&mut line).await;
                assert_eq!(line, "SET FORMAT json\n");
                if !json {
                    let _ = socket
                        .get_mut()
                        .write_all(b"ERROR: unknown command\n")
                        .await;
                    return;
                }
                let _ = socket.get_mut().write_all(b"OK\n").await;
                line.clear();
                let _ = socket.read_line(&mut line).await;
                assert_eq!(line, "STATUS\n");
                let _ = socket.get_mut().write_all(STATUS_JSON.as_bytes()).await;
            });
            addr
        }
        let addr = serve(true).await;
        let s = status(&addr, Duration::from_secs(5)).await.expect("status");
        assert_eq!(s.collectives(), 241);
        let addr = serve(false).await;
        assert!(matches!(
            status(&addr, Duration::from_secs(5)).await,
            Err(RasError::NoJson(_))
        ));
        // Nothing listens.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listen")
            .local_addr()
            .expect("addr")
            .to_string();
        assert!(matches!(
            status(&closed, Duration::from_secs(5)).await,
            Err(RasError::Connect(_)) | Err(RasError::Io(_))
        ));
    }
}
