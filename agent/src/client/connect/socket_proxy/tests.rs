use std::os::unix::fs::{FileTypeExt, PermissionsExt};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixStream};

use super::*;

/// A TCP server answering each connection's first read with `echo:` and the bytes.
async fn echo_server() -> (String, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let mut out = b"echo:".to_vec();
                    out.extend_from_slice(&buf[..n]);
                    if s.write_all(&out).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (addr, task)
}

async fn exchange(path: &Path, msg: &[u8]) -> Vec<u8> {
    let mut c = UnixStream::connect(path).await.unwrap();
    c.write_all(msg).await.unwrap();
    let mut want = b"echo:".to_vec();
    want.extend_from_slice(msg);
    let mut got = vec![0u8; want.len()];
    tokio::time::timeout(Duration::from_secs(10), c.read_exact(&mut got)).await.unwrap().unwrap();
    got
}

#[tokio::test]
async fn bytes_go_both_ways_between_the_socket_and_the_tcp_address() {
    let dir = tempfile::tempdir().unwrap();
    let (dest, _server) = echo_server().await;
    let beneath = Beneath::open(dir.path()).unwrap();
    let listener = bind_beneath(&beneath, "consul_grpc.sock").unwrap();
    let path = dir.path().join("consul_grpc.sock");
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o777, "any task user may connect");

    let proxy = SocketProxy::start(listener, dest, CancellationToken::new());
    assert_eq!(exchange(&path, b"hello").await, b"echo:hello");
    // Connections are independent and each is a stream both ways.
    let (a, b) = tokio::join!(exchange(&path, b"one"), exchange(&path, b"two"));
    assert_eq!((a.as_slice(), b.as_slice()), (&b"echo:one"[..], &b"echo:two"[..]));

    let mut open = UnixStream::connect(&path).await.unwrap();
    open.write_all(b"x").await.unwrap();
    let mut got = [0u8; 6];
    open.read_exact(&mut got).await.unwrap();
    assert!(proxy.stop().await, "stopped in time");
    assert!(!proxy.running());
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(10), open.read_to_end(&mut rest)).await.unwrap().unwrap_or(0);
    assert_eq!(n, 0, "an open connection is closed by stop");
    assert!(UnixStream::connect(&path).await.is_err(), "nothing accepts any more");
}

#[tokio::test]
async fn an_entry_a_task_left_at_the_name_is_replaced_never_followed() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    std::fs::write(&victim, "host file").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink(&victim, dir.path().join("consul_grpc.sock")).unwrap();
    let beneath = Beneath::open(dir.path()).unwrap();
    let _listener = bind_beneath(&beneath, "consul_grpc.sock").unwrap();
    assert!(std::fs::symlink_metadata(dir.path().join("consul_grpc.sock")).unwrap().file_type().is_socket());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "host file");
    assert_eq!(std::fs::metadata(&victim).unwrap().permissions().mode() & 0o777, 0o600, "never chmodded through the link");

    // A directory in its place is not removed.
    std::fs::create_dir(dir.path().join("d")).unwrap();
    assert!(bind_beneath(&beneath, "d").is_err());
}

#[tokio::test]
async fn a_destination_that_refuses_closes_the_connection_and_the_proxy_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().to_string();
    let beneath = Beneath::open(dir.path()).unwrap();
    let proxy = SocketProxy::start(bind_beneath(&beneath, "s.sock").unwrap(), closed, CancellationToken::new());
    let path = dir.path().join("s.sock");
    for _ in 0..2 {
        let mut c = UnixStream::connect(&path).await.unwrap();
        let mut rest = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut rest)).await.unwrap().unwrap_or(0);
        assert_eq!(n, 0);
    }
    assert!(proxy.running());
    proxy.stop().await;
}
