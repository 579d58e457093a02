package procstat

import (
	"os"
	"syscall"
	"testing"
)

func TestParse(t *testing.T) {
	// The 20 fields after the command name: state ppid pgrp session tty
	// tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime
	// priority nice threads itrealvalue starttime.
	const tail = " 0 -1 4194560 0 0 0 0 1 2 0 0 20 0 1 0 "
	tests := []struct {
		stat    string
		want    Stat
		exited  bool
		wantErr bool
	}{
		{stat: "4242 (python3) S 1 4242 4240" + tail + "987654", want: Stat{'S', 1, 4240, 987654}},
		{stat: "17 (a (b) c) Z 1 17 17" + tail + "5", want: Stat{'Z', 1, 17, 5}, exited: true},
		{stat: "17 (torch run) R 3 17 99" + tail + "7 0 0", want: Stat{'R', 3, 99, 7}},
		{stat: "18 (x) X 1 18 18" + tail + "9", want: Stat{'X', 1, 18, 9}, exited: true},
		{stat: "17 python3 S 1 17 99" + tail + "1", wantErr: true},
		{stat: "17 (x) S 1", wantErr: true},
		{stat: "17 (x) SS 1 17 99" + tail + "1", wantErr: true},
		{stat: "17 (x) S 1 17 nine" + tail + "1", wantErr: true},
	}
	for _, tt := range tests {
		st, err := Parse([]byte(tt.stat))
		if (err != nil) != tt.wantErr || st != tt.want || st.Exited() != tt.exited {
			t.Errorf("Parse(%q) = %+v (exited %v), %v; want %+v (exited %v), err %v", tt.stat, st, st.Exited(), err, tt.want, tt.exited, tt.wantErr)
		}
	}
}

func TestReadSelf(t *testing.T) {
	st, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	sid, _, errno := syscall.RawSyscall(syscall.SYS_GETSID, 0, 0, 0)
	if errno != 0 {
		t.Fatal(errno)
	}
	if st.Exited() || st.Start == 0 || st.PPid != os.Getppid() || st.Session != int(sid) {
		t.Fatalf("own stat %+v; ppid %d, session %d", st, os.Getppid(), sid)
	}
	if _, err := Read(-1); err == nil {
		t.Fatal("Read(-1) succeeded")
	}
}
