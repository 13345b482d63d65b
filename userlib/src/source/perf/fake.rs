//! A scripted [`Sys`] for unit tests (aya's `sys/fake.rs`): records every call, hands out
//! fake fds, backs `mmap` with [`FakeRing`]s the test can write records into, and
//! simulates a child process and the clock.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::io;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

use super::ring::tests::FakeRing;
use super::sys::{ChildExit, HeldChild, PerfEventAttr, Sys, IOC_ID};

/// One `perf_event_open` call.
#[derive(Clone, Debug)]
pub struct Open {
    pub attr: PerfEventAttr,
    pub pid: i32,
    pub cpu: i32,
    pub group_fd: i32,
    pub flags: u64,
    /// The fd returned, or the errno.
    pub result: Result<i32, i32>,
}

type OpenHook = Box<dyn FnMut(&PerfEventAttr, i32) -> Option<i32> + Send>;

/// The fake's state; tests poke at it through [`FakeSys::state`].
pub struct FakeState {
    pub next_fd: i32,
    pub opens: Vec<Open>,
    /// Returns `Some(errno)` to fail an open of (attr, cpu).
    pub open_hook: Option<OpenHook>,
    pub ioctls: Vec<(i32, u64, u64)>,
    pub rings: HashMap<i32, FakeRing>,
    pub mmap_errno: Option<i32>,
    /// Group values returned by `read` on a leader fd, group order; default all = clock.
    pub values: HashMap<i32, Vec<u64>>,
    pub reads: Vec<(i32, u64)>,
    pub closed: Vec<i32>,
    pub clock: u64,
    pub sleeps: Vec<u64>,
    /// `wait_child(nohang)` calls that still report "running".
    pub child_runs_for: u32,
    pub child_status: i32,
    pub exec_errno: Option<i32>,
    pub spawned: Vec<Vec<String>>,
    pub released: u32,
    pub killed: Vec<(i32, i32)>,
    pub files: HashMap<String, String>,
    pub dirs: HashMap<String, Vec<String>>,
    pub polls: u32,
}

/// The fake; share it with the source as `Box::new(Arc<FakeSys>)`.
pub struct FakeSys {
    state: Mutex<FakeState>,
}

pub const CHILD_PID: i32 = 4242;

impl FakeSys {
    /// Two online CPUs, no hardware PMU, a child that runs for 3 checks and exits 0.
    pub fn new() -> Arc<FakeSys> {
        let mut files = HashMap::new();
        files.insert(
            "/sys/devices/system/cpu/online".to_string(),
            "0-1\n".to_string(),
        );
        files.insert(
            "/proc/cpuinfo".to_string(),
            "processor\t: 0\nmodel name\t: Fake CPU @ 1GHz\n".to_string(),
        );
        files.insert(
            "/proc/sys/kernel/perf_event_paranoid".to_string(),
            "2\n".to_string(),
        );
        let mut dirs = HashMap::new();
        dirs.insert(
            "/sys/bus/event_source/devices".to_string(),
            vec!["breakpoint".into(), "software".into(), "tracepoint".into()],
        );
        Arc::new(FakeSys {
            state: Mutex::new(FakeState {
                next_fd: 100,
                opens: Vec::new(),
                open_hook: None,
                ioctls: Vec::new(),
                rings: HashMap::new(),
                mmap_errno: None,
                values: HashMap::new(),
                reads: Vec::new(),
                closed: Vec::new(),
                clock: 1_000_000,
                sleeps: Vec::new(),
                child_runs_for: 3,
                child_status: 0,
                exec_errno: None,
                spawned: Vec::new(),
                released: 0,
                killed: Vec::new(),
                files,
                dirs,
                polls: 0,
            }),
        })
    }

    pub fn state(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap()
    }

    fn fd(&self) -> i32 {
        let mut s = self.state();
        s.next_fd += 1;
        s.next_fd
    }
}

/// Id of a fake fd (as `PERF_EVENT_IOC_ID` reports it).
pub fn id_of(fd: i32) -> u64 {
    10_000 + fd as u64
}

impl<T: Sys + ?Sized> Sys for Arc<T> {
    fn perf_event_open(
        &self,
        a: &PerfEventAttr,
        pid: i32,
        cpu: i32,
        g: i32,
        f: u64,
    ) -> io::Result<i32> {
        (**self).perf_event_open(a, pid, cpu, g, f)
    }
    fn ioctl(&self, fd: i32, request: u64, arg: u64) -> io::Result<()> {
        (**self).ioctl(fd, request, arg)
    }
    fn event_id(&self, fd: i32) -> io::Result<u64> {
        (**self).event_id(fd)
    }
    fn mmap(&self, fd: i32, len: usize) -> io::Result<NonNull<u8>> {
        (**self).mmap(fd, len)
    }
    unsafe fn munmap(&self, ptr: NonNull<u8>, len: usize) {
        // SAFETY: forwarded with the caller's guarantee.
        unsafe { (**self).munmap(ptr, len) }
    }
    fn read(&self, fd: i32, buf: &mut [u8]) -> io::Result<usize> {
        (**self).read(fd, buf)
    }
    fn poll(&self, fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
        (**self).poll(fds, timeout_ms)
    }
    fn close(&self, fd: i32) {
        (**self).close(fd)
    }
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }
    fn sleep_until_ns(&self, deadline_ns: u64) {
        (**self).sleep_until_ns(deadline_ns)
    }
    fn find_program(&self, name: &str) -> io::Result<CString> {
        (**self).find_program(name)
    }
    fn spawn_held(&self, path: &CStr, argv: &[CString], envp: &[CString]) -> io::Result<HeldChild> {
        (**self).spawn_held(path, argv, envp)
    }
    fn release_child(&self, child: &HeldChild) -> io::Result<()> {
        (**self).release_child(child)
    }
    fn wait_child(&self, pid: i32, nohang: bool) -> io::Result<Option<ChildExit>> {
        (**self).wait_child(pid, nohang)
    }
    fn kill(&self, pid: i32, signal: i32) -> io::Result<()> {
        (**self).kill(pid, signal)
    }
    fn pidfd_open(&self, pid: i32) -> io::Result<i32> {
        (**self).pidfd_open(pid)
    }
    fn read_file(&self, path: &str) -> io::Result<String> {
        (**self).read_file(path)
    }
    fn list_dir(&self, path: &str) -> io::Result<Vec<String>> {
        (**self).list_dir(path)
    }
    fn page_size(&self) -> usize {
        (**self).page_size()
    }
}

impl Sys for FakeSys {
    fn perf_event_open(
        &self,
        attr: &PerfEventAttr,
        pid: i32,
        cpu: i32,
        group_fd: i32,
        flags: u64,
    ) -> io::Result<i32> {
        let errno = self.state().open_hook.as_mut().and_then(|h| h(attr, cpu));
        let result = match errno {
            Some(e) => Err(e),
            None => Ok(self.fd()),
        };
        self.state().opens.push(Open {
            attr: *attr,
            pid,
            cpu,
            group_fd,
            flags,
            result,
        });
        result.map_err(io::Error::from_raw_os_error)
    }

    fn ioctl(&self, fd: i32, request: u64, arg: u64) -> io::Result<()> {
        self.state().ioctls.push((fd, request, arg));
        Ok(())
    }

    fn event_id(&self, fd: i32) -> io::Result<u64> {
        self.state().ioctls.push((fd, IOC_ID, 0));
        Ok(id_of(fd))
    }

    fn mmap(&self, fd: i32, len: usize) -> io::Result<NonNull<u8>> {
        let mut s = self.state();
        if let Some(e) = s.mmap_errno {
            return Err(io::Error::from_raw_os_error(e));
        }
        let mut ring = FakeRing::new(4096, len / 4096 - 1);
        let ptr = ring.ptr();
        s.rings.insert(fd, ring);
        Ok(ptr)
    }

    unsafe fn munmap(&self, _ptr: NonNull<u8>, _len: usize) {}

    fn read(&self, fd: i32, buf: &mut [u8]) -> io::Result<usize> {
        let mut s = self.state();
        let clock = s.clock;
        s.reads.push((fd, clock));
        let members: Vec<i32> = s
            .opens
            .iter()
            .filter_map(|o| o.result.ok().filter(|&f| f == fd || o.group_fd == fd))
            .collect();
        let values = s
            .values
            .get(&fd)
            .cloned()
            .unwrap_or_else(|| vec![clock; members.len()]);
        let mut words = vec![members.len() as u64];
        for (i, m) in members.iter().enumerate() {
            words.push(values.get(i).copied().unwrap_or(0));
            words.push(id_of(*m));
        }
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        if bytes.len() > buf.len() {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        buf[..bytes.len()].copy_from_slice(&bytes);
        Ok(bytes.len())
    }

    fn poll(&self, fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
        let mut s = self.state();
        s.polls += 1;
        s.clock += timeout_ms.max(0) as u64 * 1_000_000;
        let mut ready = 0;
        for p in fds.iter_mut() {
            p.revents = 0;
            if let Some(r) = s.rings.get(&p.fd) {
                if r.buf[super::sys::MMAP_DATA_HEAD / 8] != r.buf[super::sys::MMAP_DATA_TAIL / 8] {
                    p.revents = libc::POLLIN;
                    ready += 1;
                }
            }
        }
        Ok(ready)
    }

    fn close(&self, fd: i32) {
        self.state().closed.push(fd);
    }

    fn now_ns(&self) -> u64 {
        let mut s = self.state();
        s.clock += 10; // time moves a little with every look at it
        s.clock
    }

    fn sleep_until_ns(&self, deadline_ns: u64) {
        let mut s = self.state();
        s.sleeps.push(deadline_ns);
        s.clock = s.clock.max(deadline_ns);
    }

    fn find_program(&self, name: &str) -> io::Result<CString> {
        if name.contains("missing") {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        CString::new(format!("/bin/{name}")).map_err(io::Error::other)
    }

    fn spawn_held(
        &self,
        _path: &CStr,
        argv: &[CString],
        _envp: &[CString],
    ) -> io::Result<HeldChild> {
        let (go_fd, err_fd) = (self.fd(), self.fd());
        self.state().spawned.push(
            argv.iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
        );
        Ok(HeldChild {
            pid: CHILD_PID,
            go_fd,
            err_fd,
        })
    }

    fn release_child(&self, _child: &HeldChild) -> io::Result<()> {
        let mut s = self.state();
        s.released += 1;
        match s.exec_errno {
            Some(e) => {
                s.child_runs_for = 0;
                s.child_status = 127;
                Err(io::Error::from_raw_os_error(e))
            }
            None => Ok(()),
        }
    }

    fn wait_child(&self, pid: i32, nohang: bool) -> io::Result<Option<ChildExit>> {
        assert_eq!(pid, CHILD_PID);
        let mut s = self.state();
        if nohang && s.child_runs_for > 0 {
            s.child_runs_for -= 1;
            return Ok(None);
        }
        Ok(Some(ChildExit {
            status: s.child_status,
            cpu_time_ns: 5_000_000,
        }))
    }

    fn kill(&self, pid: i32, signal: i32) -> io::Result<()> {
        let mut s = self.state();
        s.killed.push((pid, signal));
        s.child_runs_for = 0;
        s.child_status = -signal;
        Ok(())
    }

    fn pidfd_open(&self, _pid: i32) -> io::Result<i32> {
        Err(io::Error::from_raw_os_error(libc::ENOSYS))
    }

    fn read_file(&self, path: &str) -> io::Result<String> {
        self.state()
            .files
            .get(path)
            .cloned()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
    }

    fn list_dir(&self, path: &str) -> io::Result<Vec<String>> {
        self.state()
            .dirs
            .get(path)
            .cloned()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
    }

    fn page_size(&self) -> usize {
        4096
    }
}
