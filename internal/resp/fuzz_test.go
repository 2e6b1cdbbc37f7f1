package resp

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"
)

// FuzzReadCommand feeds arbitrary streams to the parser and to a
// connection's command loop: neither may panic, every command read stays
// within the limits, and the loop's reply is well formed RESP.
func FuzzReadCommand(f *testing.F) {
	for _, s := range []string{
		"PING\r\n",
		"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n",
		"*6\r\n$11\r\nCL.THROTTLE\r\n$1\r\nk\r\n$1\r\n4\r\n$1\r\n1\r\n$2\r\n10\r\n$1\r\n0\r\n",
		"*7\r\n$4\r\nGCRA\r\n$1\r\nk\r\n$1\r\n4\r\n$1\r\n1\r\n$3\r\n0.5\r\n$6\r\nTOKENS\r\n$1\r\n2\r\n",
		"HELLO 3 AUTH default x SETNAME n\r\nCLIENT GETNAME\r\n",
		"*-1\r\n*0\r\n*1\r\n$-1\r\n",
		"*3\r\n$3\r\nSET\r\n$99999999999\r\n",
		"WEIR.RESERVE api k 2\r\nWEIR.SETTLE r1 1\r\nWEIR.SETTLE r1 1\r\n",
		"HELLO 3\r\n*6\r\n$12\r\nWEIR.RESERVE\r\n$3\r\napi\r\n$1\r\nk\r\n$1\r\n1\r\n$4\r\nTIER\r\n$4\r\ngold\r\n",
	} {
		f.Add([]byte(s))
	}
	lim := Limits{MaxArgs: 8, MaxBulk: 32}
	lim.fill()
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bufio.NewReaderSize(bytes.NewReader(in), maxLine)
		var a argBuf
		for i := 0; ; i++ {
			if i%3 == 0 {
				a.reset()
			}
			args, _, err := readCommand(r, &lim, &a)
			if err != nil {
				var pe *ProtocolError
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.As(err, &pe) {
					t.Fatalf("unexpected error type %T: %v", err, err)
				}
				break
			}
			if len(args) > lim.MaxArgs {
				t.Fatalf("%d arguments passed the bound", len(args))
			}
			for _, a := range args {
				if len(a) > lim.MaxBulk {
					t.Fatalf("argument of %d bytes passed the bound", len(a))
				}
			}
		}
		b := &memBackend{}
		b.st = newFuzzStore()
		s := NewServer(b, Config{Limits: lim})
		c := &conn{s: s, nc: &pipeConn{r: bytes.NewReader(in)}, proto: 2, authed: true}
		s.slots <- struct{}{}
		s.wg.Add(1)
		c.serve()
		s.Close() // ends the workers it started
		out := c.nc.(*pipeConn).w.Bytes()
		rr := bufio.NewReader(bytes.NewReader(out))
		for rr.Buffered() > 0 || len(out) > 0 {
			if err := skipReply(rr); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				t.Fatalf("malformed reply %q: %v", out, err)
			}
		}
	})
}

// skipReply reads one RESP reply.
func skipReply(r *bufio.Reader) error {
	line, err := r.ReadString('\n')
	if err != nil {
		if line == "" {
			return io.EOF
		}
		return err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return errors.New("bad line")
	}
	body := []byte(line[1 : len(line)-2])
	switch line[0] {
	case '+', '-', ':', '_':
		return nil
	case '$':
		n, ok := parseInt(body)
		if !ok {
			return errors.New("bad bulk length")
		}
		if n < 0 {
			return nil
		}
		_, err := io.ReadFull(r, make([]byte, n+2))
		return err
	case '*', '%':
		n, ok := parseInt(body)
		if !ok {
			return errors.New("bad length")
		}
		if line[0] == '%' {
			n *= 2
		}
		for range n {
			if err := skipReply(r); err != nil {
				return err
			}
		}
		return nil
	}
	return errors.New("unknown type")
}
