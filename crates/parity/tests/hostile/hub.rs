//! Downloads from a Hub endpoint that stalls or lies (issue 20): connections have timeouts
//! (`HF_HUB_ETAG_TIMEOUT` for the answer, `HF_HUB_DOWNLOAD_TIMEOUT` between bytes), and the
//! commit and ETag a server names cannot lead a cache path anywhere. A well-behaved endpoint
//! fills the cache as `huggingface_hub` lays it out, and the check passes from it.
//!
//! The endpoint is a small HTTP server in this test (`HF_ENDPOINT=http://127.0.0.1:PORT`); each
//! run of the CLI is a child process ([`crate::common::run_limited`]), so the environment stays its own.

use crate::common::{run_limited, scratch, weights};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;

const COMMIT: &str = "89abcdef0123456789abcdef0123456789abcdef";

/// How the test server answers one request.
enum Reply {
    /// Accept, read the request, never answer.
    Stall,
    /// Status, headers, body; `stall_after`: send that many body bytes, then nothing more.
    Answer {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
        stall_after: Option<usize>,
    },
    /// Status 200 and `headers` without a length, then the connection closed (a HEAD that
    /// declares no size).
    Head { headers: Vec<(String, String)> },
    /// Status 200 and `headers` without a length, then `chunks` pieces of `chunk` bytes,
    /// `every` apart (a server that streams past the size it declared, or trickles).
    Stream {
        headers: Vec<(String, String)>,
        chunk: usize,
        chunks: usize,
        every: std::time::Duration,
    },
}

/// An HTTP/1.1 server on 127.0.0.1 answering each request (method, path) with `reply`; its URL.
fn serve(reply: impl Fn(&str, &str) -> Reply + Send + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut stalled: Vec<TcpStream> = vec![];
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = vec![];
            let mut byte = [0u8];
            while !request.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                request.push(byte[0]);
            }
            let text = String::from_utf8_lossy(&request).into_owned();
            let mut first = text.split_whitespace();
            let (method, path) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
            match reply(method, path) {
                Reply::Stall => stalled.push(stream),
                Reply::Head { headers } => {
                    let mut head = "HTTP/1.1 200 OK\r\nConnection: close\r\n".to_string();
                    for (k, v) in headers {
                        head.push_str(&format!("{k}: {v}\r\n"));
                    }
                    head.push_str("\r\n");
                    let _ = stream.write_all(head.as_bytes());
                }
                Reply::Stream {
                    headers,
                    chunk,
                    chunks,
                    every,
                } => {
                    // On a thread of its own: a trickle must not hold up the next request.
                    std::thread::spawn(move || {
                        let mut head = "HTTP/1.1 200 OK\r\nConnection: close\r\n".to_string();
                        for (k, v) in headers {
                            head.push_str(&format!("{k}: {v}\r\n"));
                        }
                        head.push_str("\r\n");
                        let _ = stream.write_all(head.as_bytes());
                        let piece = vec![b' '; chunk];
                        for _ in 0..chunks {
                            if stream.write_all(&piece).is_err() {
                                break;
                            }
                            std::thread::sleep(every);
                        }
                    });
                }
                Reply::Answer {
                    status,
                    headers,
                    body,
                    stall_after,
                } => {
                    let mut head = format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\n", body.len());
                    for (k, v) in headers {
                        head.push_str(&format!("{k}: {v}\r\n"));
                    }
                    let _ = stream.write_all(head.as_bytes());
                    let _ = stream.write_all(b"Connection: close\r\n\r\n");
                    if method != "HEAD" {
                        let n = stall_after.unwrap_or(body.len()).min(body.len());
                        let _ = stream.write_all(&body[..n]);
                        if stall_after.is_some() {
                            stalled.push(stream);
                        }
                    }
                }
            }
        }
    });
    url
}

/// The files of the committed diffusers UNet2DModel, served as `acme/tiny` at [`COMMIT`] with
/// the ETags `etag(name)`.
fn model_server(etag: fn(&str) -> String, commit: &'static str) -> String {
    serve(move |_, path| {
        let prefix = "/acme/tiny/resolve/main/";
        let Some(file) = path.strip_prefix(prefix) else {
            return Reply::Answer {
                status: 404,
                headers: vec![],
                body: vec![],
                stall_after: None,
            };
        };
        match std::fs::read(weights().join("models/diffusers_unet2d").join(file)) {
            Ok(body) => Reply::Answer {
                status: 200,
                headers: vec![
                    ("X-Repo-Commit".into(), commit.into()),
                    ("ETag".into(), format!("\"{}\"", etag(file))),
                ],
                body,
                stall_after: None,
            },
            Err(_) => Reply::Answer {
                status: 404,
                headers: vec![],
                body: vec![],
                stall_after: None,
            },
        }
    })
}

fn hex_etag(file: &str) -> String {
    format!("{:0>40}", file.len())
}

/// `check` of the UNet2DModel mid-block bundle with `--repo acme/tiny` against `endpoint`.
fn check_from(endpoint: &str, cache: &Path, timeouts: &str) -> crate::common::Child {
    let bundle = weights().join("mid/unet_mid_block_2d_unet2d_ref.safetensors");
    let args = [
        "check",
        bundle.to_str().unwrap(),
        "--repo",
        "acme/tiny",
        "--cache-dir",
        cache.to_str().unwrap(),
    ];
    let env = [
        ("HF_ENDPOINT", endpoint),
        ("HF_HUB_ETAG_TIMEOUT", timeouts),
        ("HF_HUB_DOWNLOAD_TIMEOUT", timeouts),
        ("HF_HUB_OFFLINE", "0"),
        ("HF_TOKEN", "test-token"),
        ("NO_PROXY", "127.0.0.1,localhost"),
        ("no_proxy", "127.0.0.1,localhost"),
    ];
    run_limited(&args, &env)
}

/// A server that accepts and never answers: the run ends after the timeout with one line.
#[test]
fn a_stalled_connection_times_out() {
    let endpoint = serve(|_, _| Reply::Stall);
    let c = check_from(&endpoint, &scratch("hub-stall"), "1");
    assert_eq!(c.code, 2, "{}", c.err);
    assert!(c.err.contains("timed out"), "{}", c.err);
    assert!(c.took.as_secs() < 10, "{:?}", c.took);
}

/// A server that answers, then stalls in the middle of the body.
#[test]
fn a_download_that_stalls_ends() {
    let endpoint = serve(|method, _| Reply::Answer {
        status: 200,
        headers: vec![
            ("X-Repo-Commit".into(), COMMIT.into()),
            ("ETag".into(), format!("\"{}\"", "ab".repeat(32))),
        ],
        body: vec![b' '; 1000],
        stall_after: (method == "GET").then_some(10),
    });
    let c = check_from(&endpoint, &scratch("hub-stall-body"), "1");
    assert_eq!(c.code, 2, "{}", c.err);
    assert!(c.err.contains("stalled") || c.err.contains("timed out"), "{}", c.err);
    assert!(c.took.as_secs() < 10, "{:?}", c.took);
}

/// The HEAD of a file that declares 1000 bytes, and a GET answered by `stream`.
fn declares_1000(stream: fn() -> Reply) -> String {
    serve(move |method, _| match method {
        "GET" => stream(),
        _ => Reply::Answer {
            status: 200,
            headers: vec![
                ("X-Repo-Commit".into(), COMMIT.into()),
                ("ETag".into(), format!("\"{}\"", "cd".repeat(32))),
            ],
            body: vec![b' '; 1000],
            stall_after: None,
        },
    })
}

/// No blob of the weights (ETag `34...`, see [`weights_headers`]) in the cache, nor a temporary
/// one: only `config.json`'s.
fn no_weights_blob(cache: &Path) {
    let blobs = cache.join("models--acme--tiny/blobs");
    let left: Vec<_> = std::fs::read_dir(&blobs).map_or(vec![], |d| d.flatten().map(|e| e.path()).collect());
    let config = "12".repeat(32);
    assert!(
        left.iter()
            .all(|p| p.file_name().is_some_and(|n| n.to_string_lossy() == config)),
        "{left:?}"
    );
}

/// No file left in the cache's blobs (nor a temporary one).
fn no_blobs(cache: &Path) {
    let blobs = cache.join("models--acme--tiny/blobs");
    let left: Vec<_> = std::fs::read_dir(&blobs).map_or(vec![], |d| d.flatten().map(|e| e.path()).collect());
    assert!(left.is_empty(), "{left:?}");
}

/// A server that declares 1000 bytes and then streams on (64 MiB at most here): the download
/// stops just past the declared size, and nothing stays in the cache.
#[test]
fn a_download_past_its_declared_size_is_cut_off() {
    let endpoint = declares_1000(stream_64_mib);
    let cache = scratch("hub-overlong");
    let c = check_from(&endpoint, &cache, "5");
    assert_eq!(c.code, 2, "{}", c.err);
    assert!(c.err.contains("more than the 1000 bytes"), "{}", c.err);
    assert_eq!(c.err.lines().count(), 1, "{}", c.err);
    assert!(c.took.as_secs() < 10, "{:?}", c.took);
    no_blobs(&cache);
}

/// A server that trickles a byte every 300 ms, within the 1-second read timeout: the minimum
/// rate (256 KiB/s over 3 × the read timeout) ends it.
#[test]
fn a_trickling_download_is_too_slow() {
    let endpoint = declares_1000(|| Reply::Stream {
        headers: vec![],
        chunk: 1,
        chunks: 60,
        every: std::time::Duration::from_millis(300),
    });
    let cache = scratch("hub-trickle");
    let c = check_from(&endpoint, &cache, "1");
    assert_eq!(c.code, 2, "{}", c.err);
    assert!(c.err.contains("too slow"), "{}", c.err);
    assert!(c.took.as_secs() < 10, "{:?}", c.took);
    no_blobs(&cache);
}

// ---- Issue 54: a cap the user sets, and a minimum rate ----

/// The committed model's `config.json` as it is (HEAD and GET), and every other file as
/// `weights(method)` answers it.
fn weights_server(answer: fn(&str) -> Reply) -> String {
    serve(move |method, path| {
        if path.ends_with("/config.json") {
            let body = std::fs::read(weights().join("models/diffusers_unet2d/config.json")).unwrap();
            return Reply::Answer {
                status: 200,
                headers: vec![
                    ("X-Repo-Commit".into(), COMMIT.into()),
                    ("ETag".into(), format!("\"{}\"", "12".repeat(32))),
                ],
                body,
                stall_after: None,
            };
        }
        answer(method)
    })
}

/// 64 MiB sent as fast as they go, with no length.
fn stream_64_mib() -> Reply {
    Reply::Stream {
        headers: vec![],
        chunk: 1 << 20,
        chunks: 64,
        every: std::time::Duration::ZERO,
    }
}

fn weights_headers() -> Vec<(String, String)> {
    vec![
        ("X-Repo-Commit".into(), COMMIT.into()),
        ("ETag".into(), format!("\"{}\"", "34".repeat(32))),
    ]
}

/// `check_from` with more arguments.
fn check_from_with(endpoint: &str, cache: &Path, timeouts: &str, more: &[&str]) -> crate::common::Child {
    let bundle = weights().join("mid/unet_mid_block_2d_unet2d_ref.safetensors");
    let mut args = vec![
        "check",
        bundle.to_str().unwrap(),
        "--repo",
        "acme/tiny",
        "--cache-dir",
        cache.to_str().unwrap(),
    ];
    args.extend_from_slice(more);
    let env = [
        ("HF_ENDPOINT", endpoint),
        ("HF_HUB_ETAG_TIMEOUT", timeouts),
        ("HF_HUB_DOWNLOAD_TIMEOUT", timeouts),
        ("HF_HUB_OFFLINE", "0"),
        ("NO_PROXY", "127.0.0.1,localhost"),
        ("no_proxy", "127.0.0.1,localhost"),
    ];
    run_limited(&args, &env)
}

/// Weights declared at 10^15 bytes: refused before a byte is fetched, by the default cap (the free
/// disk space less a reserve) and by `--max-download` (it wrote 3.2 GB in 13 s, bounded only by
/// the declared size).
#[test]
fn weights_declared_past_the_cap_are_refused_before_a_byte() {
    let endpoint = weights_server(|method| match method {
        "GET" => stream_64_mib(),
        _ => Reply::Answer {
            status: 200,
            headers: [
                weights_headers(),
                vec![("X-Linked-Size".into(), "1000000000000000".into())],
            ]
            .concat(),
            body: vec![],
            stall_after: None,
        },
    });
    for more in [&[][..], &["--max-download", "1M"][..]] {
        let cache = scratch(&format!("hub-cap-declared-{}", more.len()));
        let c = check_from_with(&endpoint, &cache, "5", more);
        assert_eq!(c.code, 2, "{more:?}: {}", c.err);
        assert!(
            c.err
                .contains("declares 1000000000000000 bytes, more than the download cap")
                && c.err.lines().count() == 1,
            "{more:?}: {}",
            c.err
        );
        let from = if more.is_empty() {
            "free space"
        } else {
            "--max-download"
        };
        assert!(c.err.contains(from), "{}", c.err);
        assert!(c.took.as_secs() < 10, "{:?}", c.took);
        no_weights_blob(&cache);
    }
}

/// Weights whose size is not declared: held to `--max-download` as the bytes arrive (64 MiB
/// streamed, cut off after 1 MiB, nothing left in the cache).
#[test]
fn max_download_caps_the_bytes_as_they_arrive() {
    let endpoint = weights_server(|method| match method {
        "GET" => stream_64_mib(),
        _ => Reply::Head {
            headers: weights_headers(),
        },
    });
    let cache = scratch("hub-cap-arriving");
    let c = check_from_with(&endpoint, &cache, "5", &["--max-download", "1M"]);
    assert_eq!(c.code, 2, "{}", c.err);
    assert!(
        c.err.contains("more than the download cap of 1048576 bytes"),
        "{}",
        c.err
    );
    assert!(c.took.as_secs() < 10, "{:?}", c.took);
    no_weights_blob(&cache);
}

/// A 64 KiB/s drip of a file declared at 10 MiB (its old deadline: 160 s, and hours for a real
/// checkpoint): below the minimum rate over a window of 3 × the 1-second read timeout, it ends in
/// seconds; `--min-download-rate` lower than the drip lets it go on.
#[test]
fn a_dripping_download_ends_at_the_minimum_rate() {
    let endpoint = weights_server(|method| match method {
        "GET" => Reply::Stream {
            headers: vec![],
            chunk: 16 << 10,
            chunks: 640,
            every: std::time::Duration::from_millis(250),
        },
        _ => Reply::Answer {
            status: 200,
            headers: [
                weights_headers(),
                vec![("X-Linked-Size".into(), (10u64 << 20).to_string())],
            ]
            .concat(),
            body: vec![],
            stall_after: None,
        },
    });
    let cache = scratch("hub-drip");
    let c = check_from_with(&endpoint, &cache, "1", &[]);
    assert_eq!(c.code, 2, "{}", c.err);
    assert!(c.err.contains("too slow") && c.err.contains("256.0 KiB"), "{}", c.err);
    assert!(c.took.as_secs() < 10, "{:?}", c.took);
    no_weights_blob(&cache);
}

/// A `config.json` declared at 1 TiB is refused before a byte of it is fetched.
#[test]
fn a_json_file_declared_huge_is_refused() {
    let endpoint = serve(|method, _| match method {
        "GET" => Reply::Stall,
        _ => Reply::Answer {
            status: 200,
            headers: vec![
                ("X-Repo-Commit".into(), COMMIT.into()),
                ("ETag".into(), format!("\"{}\"", "ef".repeat(32))),
                ("X-Linked-Size".into(), (1u64 << 40).to_string()),
            ],
            body: vec![],
            stall_after: None,
        },
    });
    let c = check_from(&endpoint, &scratch("hub-huge-json"), "5");
    assert_eq!(c.code, 2, "{}", c.err);
    assert!(
        c.err.contains("JSON file") && c.err.contains("config.json"),
        "{}",
        c.err
    );
}

/// A well-behaved endpoint: the files land in the cache as `huggingface_hub` lays them out
/// (`blobs/<etag>`, `snapshots/<commit>/<file>` linking to it, `refs/main`), the check passes,
/// and passes again offline from the cache.
#[test]
fn a_download_fills_the_cache_and_passes() {
    let endpoint = model_server(hex_etag, COMMIT);
    let cache = scratch("hub-good");
    let c = check_from(&endpoint, &cache, "5");
    assert_eq!(c.code, 0, "{}{}", c.out, c.err);
    assert!(c.out.contains("1 passed, 0 failed"), "{}", c.out);
    let repo = cache.join("models--acme--tiny");
    assert_eq!(std::fs::read_to_string(repo.join("refs/main")).unwrap(), COMMIT);
    let pointer = repo.join("snapshots").join(COMMIT).join("config.json");
    let target = std::fs::read_link(&pointer).unwrap();
    assert_eq!(target, Path::new("../../blobs").join(hex_etag("config.json")));
    let c = check_from("http://127.0.0.1:9", &cache, "1");
    assert_eq!(c.code, 0, "from the cache: {}{}", c.out, c.err);
}

/// An endpoint whose ETag or commit is a path: refused, nothing written outside the cache.
#[test]
fn a_lying_endpoint_cannot_place_files() {
    let cache = scratch("hub-lies");
    let escape = cache
        .parent()
        .unwrap()
        .join(format!("hub-lies-escaped-{}", std::process::id()));
    fn dotted(_: &str) -> String {
        "../../../../hub-lies-escaped".into()
    }
    for (endpoint, needle) in [
        (model_server(dotted, COMMIT), "not a hex hash"),
        (
            model_server(hex_etag, "../../../../hub-lies-escaped"),
            "not a 40-hex-digit hash",
        ),
    ] {
        let c = check_from(&endpoint, &cache, "5");
        assert_eq!(c.code, 2, "{}", c.err);
        assert!(c.err.contains(needle) && c.err.lines().count() == 1, "{}", c.err);
        assert!(!escape.exists());
        assert!(!cache.parent().unwrap().join("hub-lies-escaped").exists());
    }
}

/// A cache whose `blobs` folder links out of it: a download does not write through it.
#[test]
fn a_download_does_not_write_through_a_planted_cache() {
    let cache = scratch("hub-planted");
    let outside = scratch("hub-planted-outside");
    let repo = cache.join("models--acme--tiny");
    std::fs::create_dir_all(&repo).unwrap();
    std::os::unix::fs::symlink(&outside, repo.join("blobs")).unwrap();
    let c = check_from(&model_server(hex_etag, COMMIT), &cache, "5");
    assert_eq!(c.code, 2, "{}", c.err);
    assert!(c.err.contains("leads out of the Hub cache"), "{}", c.err);
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "written outside the cache"
    );
}

/// The library's way in: a Candle program's `hf_hub::api::sync::ApiRepo` (built with
/// `ApiBuilder::with_endpoint`) handed to [`HubFiles`], in this process.
mod through_an_api_repo {
    use super::*;
    use std::time::{Duration, Instant};
    use unet_parity::hub::hf_hub::api::sync::{ApiBuilder, ApiRepo};
    use unet_parity::hub::hf_hub::{Cache, Repo};
    use unet_parity::hub::{offline_from_env, HubFiles};
    use unet_parity::ParityError;

    /// The `ApiRepo` for `id` at `endpoint`, and the [`HubFiles`] of `acme/tiny` in `cache`
    /// (1-second timeouts).
    fn handles(endpoint: &str, id: &str, cache: &Path) -> (ApiRepo, HubFiles) {
        let api = ApiBuilder::from_cache(Cache::new(cache.to_path_buf()))
            .with_endpoint(endpoint.to_string())
            .with_progress(false)
            .build()
            .unwrap();
        let files = HubFiles::new(Repo::model("acme/tiny".into()), Cache::new(cache.to_path_buf()))
            .unwrap()
            .with_timeouts(Duration::from_secs(1), Duration::from_secs(1));
        (api.repo(Repo::model(id.into())), files)
    }

    /// The message of a [`ParityError::Hub`] (any other error fails the test).
    fn hub_message(e: ParityError) -> String {
        assert!(matches!(e, ParityError::Hub { .. }), "{e:?}");
        let line = e.to_string();
        assert_eq!(line.lines().count(), 1, "{line}");
        line
    }

    /// A well-behaved endpoint: `config.json` and the weights land in the cache as the CLI lays
    /// them out, the paths returned inside it; then the cache alone answers.
    #[test]
    fn files_are_downloaded_into_the_cache() {
        if offline_from_env() {
            return eprintln!("HF_HUB_OFFLINE is set: the download is not tried");
        }
        let cache = scratch("hub-api-good");
        let (api, files) = handles(&model_server(hex_etag, COMMIT), "acme/tiny", &cache);
        let (config, weights) = files.model_files(&api).unwrap();
        let root = cache.canonicalize().unwrap();
        for path in [&config, &weights] {
            assert!(path.canonicalize().unwrap().starts_with(&root), "{}", path.display());
        }
        let repo = cache.join("models--acme--tiny");
        assert_eq!(config, repo.join("snapshots").join(COMMIT).join("config.json"));
        assert_eq!(std::fs::read_to_string(repo.join("refs/main")).unwrap(), COMMIT);
        assert_eq!(files.cached_model_files().unwrap(), Some((config, weights)));
    }

    /// ETags and commits that are paths, and a server that never answers: typed errors, no
    /// panic, nothing written outside the cache, the stall ended by the timeout.
    #[test]
    fn a_hostile_endpoint_gets_an_error() {
        if offline_from_env() {
            return eprintln!("HF_HUB_OFFLINE is set: the download is not tried");
        }
        let cache = scratch("hub-api-lies");
        fn dotted(_: &str) -> String {
            "../../../../hub-api-escaped".into()
        }
        for (endpoint, needle) in [
            (model_server(dotted, COMMIT), "not a hex hash"),
            (
                model_server(hex_etag, "/tmp/hub-api-escaped"),
                "not a 40-hex-digit hash",
            ),
            (serve(|_, _| Reply::Stall), "timed out"),
        ] {
            let (api, files) = handles(&endpoint, "acme/tiny", &cache);
            let start = Instant::now();
            let message = hub_message(files.get(&api, "config.json").unwrap_err());
            assert!(message.contains(needle) && message.contains("acme/tiny"), "{message}");
            assert!(start.elapsed() < Duration::from_secs(10), "{:?}", start.elapsed());
            assert!(!cache.parent().unwrap().join("hub-api-escaped").exists());
            assert!(!Path::new("/tmp/hub-api-escaped").exists());
        }
    }

    /// Timeouts of `Duration::MAX` mean "no shorter limit", not a panic adding them to the clock.
    #[test]
    fn the_longest_timeouts_do_not_panic() {
        if offline_from_env() {
            return eprintln!("HF_HUB_OFFLINE is set: the download is not tried");
        }
        let cache = scratch("hub-api-max");
        let (api, files) = handles(&model_server(hex_etag, COMMIT), "acme/tiny", &cache);
        let files = files.with_timeouts(Duration::MAX, Duration::MAX);
        let config = files.get(&api, "config.json").unwrap();
        assert!(config.is_file(), "{}", config.display());
    }

    /// The library's cap ([`unet_parity::hub::DownloadLimits`]): a file declared larger is refused
    /// before a byte is fetched.
    #[test]
    fn the_library_sets_the_cap() {
        if offline_from_env() {
            return eprintln!("HF_HUB_OFFLINE is set: the download is not tried");
        }
        let cache = scratch("hub-api-cap");
        let (api, files) = handles(&model_server(hex_etag, COMMIT), "acme/tiny", &cache);
        let files = files.with_download_limits(unet_parity::hub::DownloadLimits {
            max_bytes: Some(10),
            ..Default::default()
        });
        let message = hub_message(files.get(&api, "config.json").unwrap_err());
        assert!(
            message.contains("more than the download cap of 10 (--max-download)"),
            "{message}"
        );
        no_blobs(&cache);
    }

    /// An `ApiRepo` for another repository than the [`HubFiles`]: refused before any request.
    #[test]
    fn an_api_repo_for_another_repository_is_refused() {
        let cache = scratch("hub-api-other");
        let (api, files) = handles("http://127.0.0.1:9", "acme/other", &cache);
        let message = hub_message(files.get(&api, "config.json").unwrap_err());
        assert!(message.contains("not for this repository"), "{message}");
    }
}
