//! This process's instance id: the `locked_by` of the tasks it runs and the
//! name of its Scheduler's inbox queue, so it must be a safe queue name.
//! Given with `--instance-id` (or `ROTA_INSTANCE_ID`), else
//! `<hostname>-<pid>`.

use anyhow::anyhow;
use rota_model::InstanceId;

/// The longest instance id: its Scheduler's inbox queue name keeps 80 bytes.
const BYTES_MAX: usize = 80;
/// The most characters of the host name kept in a default instance id.
const HOSTNAME_CHARS_MAX: usize = 60;

/// The id `--instance-id` gives, checked, or the default one.
pub fn from_flag(given: Option<&str>) -> anyhow::Result<InstanceId> {
    match given {
        Some(id) => checked(id),
        None => Ok(default()),
    }
}

fn queue_name_safe(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')
}

/// Checks an `--instance-id`: a valid instance id that is also safe as a
/// queue name, so that two ids never share an inbox.
fn checked(id: &str) -> anyhow::Result<InstanceId> {
    anyhow::ensure!(
        !id.is_empty() && id.len() <= BYTES_MAX && id.chars().all(queue_name_safe),
        "--instance-id {id:?} must be 1 to {BYTES_MAX} ASCII letters, digits, '-', '_', '.' or ':'"
    );
    InstanceId::new(id).map_err(|err| anyhow!("--instance-id: {err}"))
}

/// `<hostname>-<pid>`, with every character a queue name refuses replaced.
fn default() -> InstanceId {
    let host: String = hostname().chars().take(HOSTNAME_CHARS_MAX).map(|c| if queue_name_safe(c) { c } else { '_' }).collect();
    let host = if host.is_empty() { "rota".to_owned() } else { host };
    InstanceId::new(format!("{host}-{}", std::process::id())).expect("a sanitized host name and a pid make a valid id")
}

fn hostname() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: the pointer and length describe a writable buffer we own;
    // gethostname writes at most that many bytes.
    let rc = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    String::from_utf8_lossy(&buffer[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_instance_ids_are_queue_name_safe() {
        let id = from_flag(None).unwrap();
        assert!(id.as_str().ends_with(&format!("-{}", std::process::id())), "{id}");
        assert!(checked(id.as_str()).is_ok(), "{id}");
    }

    #[test]
    fn instance_ids_must_be_queue_name_safe() {
        assert_eq!(from_flag(Some("node-1.eu:a_b")).unwrap().as_str(), "node-1.eu:a_b");
        for bad in ["", "has space", "slash/y", "é", &"x".repeat(81)] {
            let err = from_flag(Some(bad)).unwrap_err().to_string();
            assert!(err.starts_with("--instance-id"), "{err}");
        }
    }
}
